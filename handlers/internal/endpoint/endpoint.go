// Package endpoint connects the handlers to plugins' endpoints, confined to
// the directories the operator allows.
//
// The manager checks a plugin's endpoint against its EndpointRoots once, when
// the plugin registers; a handler connects to the endpoint then and again
// later (gRPC reconnects, a device plugin's stream is redialed). Anyone who
// may write inside a root could replace the endpoint with a symlink after the
// check and lead a reconnect out of the root, to a socket of their choosing.
// Dialer checks at every connection, and connects without following any
// symlink after the check.
package endpoint

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
)

// ErrOutside is returned, wrapped, when an endpoint resolves outside every
// allowed directory.
var ErrOutside = errors.New("outside the directories endpoints must be in")

// Dialer connects to endpoints (unix socket paths). Its zero value connects
// to any endpoint. It is safe for concurrent use.
type Dialer struct {
	// Roots, if set, are the directories an endpoint must be in, symlinks
	// resolved, at every connection: the manager's Options.EndpointRoots.
	Roots []string
}

// For is the dialer of a plugin's endpoint: confined to roots, unless the
// endpoint is the plugin's registration socket, which the manager allows
// wherever roots are.
func For(endpoint, socket string, roots []string) Dialer {
	if filepath.Clean(endpoint) == filepath.Clean(socket) {
		return Dialer{}
	}
	return Dialer{Roots: roots}
}

// Dial connects to the unix socket at path, bounded by ctx.
func (d Dialer) Dial(ctx context.Context, path string) (net.Conn, error) {
	if len(d.Roots) == 0 {
		var nd net.Dialer
		return nd.DialContext(ctx, "unix", path)
	}
	resolved, err := filepath.EvalSymlinks(path)
	if err != nil {
		return nil, fmt.Errorf("endpoint %s: %w", path, err)
	}
	for _, root := range d.Roots {
		r, err := filepath.EvalSymlinks(root)
		if err != nil {
			continue
		}
		if rel, ok := beneath(resolved, r); ok {
			return dialBeneath(ctx, path, r, rel)
		}
	}
	return nil, fmt.Errorf("endpoint %s resolves to %s, %w (%s): not connecting", path, resolved, ErrOutside, strings.Join(d.Roots, ", "))
}

// beneath returns p relative to dir, if p is inside dir (not dir itself).
func beneath(p, dir string) (string, bool) {
	rel, err := filepath.Rel(dir, p)
	if err != nil || rel == "." || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return "", false
	}
	return rel, true
}
