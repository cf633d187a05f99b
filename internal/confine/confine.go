// Package confine connects to unix sockets without being led elsewhere by a
// symlink: to a plugin's registration socket inside the registry directory
// (the manager), and to a plugin's endpoint inside the directories the
// operator allows (the handlers).
//
// A path is checked once, when a plugin is found or registers; it is
// connected to then and again later (a redial after a hang-up, a probe, a
// retried notification, gRPC reconnecting to an endpoint, a device plugin's
// stream redialed). Anyone who may write where the socket is could replace
// it, or a directory on the way, with a symlink after the check and lead a
// later connection, made as root, to a socket of their choosing.
// Root.Socket walks to the socket from a descriptor of its directory one component at a
// time, following no symlink, checks that what it found is a socket (and the
// very file expected), and connects through that descriptor: what it checked
// is what it connects to.
package confine

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"syscall"
)

// ErrOutside is returned, wrapped, when an endpoint resolves outside every
// allowed directory.
var ErrOutside = errors.New("outside the directories endpoints must be in")

// ErrChanged is returned, wrapped, by Root.Socket when the path is not what was
// checked any more: a component of it is a symlink (which is never
// followed), or the file is not a socket, or not the socket expected.
var ErrChanged = errors.New("changed since it was checked")

// errSymlink is in the ErrChanged of a walk that met a symlink: the one
// change that can lead a connection elsewhere.
var errSymlink = errors.New("a symlink, which is not followed")

// ErrReplaced is the ErrChanged of a path where another socket is now: as
// a plugin restarting in place leaves it, nothing out of the ordinary.
var ErrReplaced = fmt.Errorf("%w: another socket is there now", ErrChanged)

// MaxPath is the longest path, in bytes, of a unix socket that can be
// connected to by its name: sun_path's size, less its terminating NUL (107
// on Linux and Windows, 103 on darwin and the BSDs). The kubelet and every
// plugin SDK connect by name; a socket at a longer path can be reached by no
// one of them.
const MaxPath = len(syscall.RawSockaddrUnix{}.Path) - 1

// Identity is what tells one file from another on a filesystem: its device
// and inode numbers. The zero Identity is any file.
type Identity struct{ Dev, Ino uint64 }

// inside is rel clean, if it is a relative path inside root.
func inside(root, rel string) (string, error) {
	clean := filepath.Clean(rel) // "a/../../x" is "../x": checked as it will be walked
	if rel == "" || filepath.IsAbs(clean) || clean == "." || clean == ".." || strings.HasPrefix(clean, ".."+string(filepath.Separator)) {
		return "", fmt.Errorf("%s is not a path inside %s", rel, root)
	}
	return clean, nil
}

// Root is a directory sockets below it are connected to through a
// descriptor of it held open (on Linux): a connection walks from that
// descriptor, not from the directory opened again by its path, which
// spares two system calls of every connection made there.
//
// The directory at the path may be replaced (removed and made again, moved,
// or the operator's symlink to it changed). A walk from the descriptor held
// then still reaches only the socket file expected, or nothing: Root
// connects only to a given Identity. A walk that does not reach it opens
// the directory at the path again and, if that is another directory than
// the one held, holds it and walks again, so that what is at the path now
// is what a failure reports; so does Reopen, for a caller that knows of a
// replacement. The zero Identity is connected to from the directory opened
// again.
//
// Until Reopen, a socket left in a directory moved away is still reached
// from the descriptor held: only that very file, found inside the registry
// before (the manager calls Reopen at the directory's watch event). The
// descriptor held also keeps the directory's filesystem busy (umount says
// EBUSY) until Close.
//
// A Root is safe for concurrent use.
type Root struct {
	path string
	held heldDir // per OS: the descriptor held, on Linux
}

// NewRoot returns the Root of the directory at path. Nothing is opened
// until the first connection.
func NewRoot(path string) *Root { return &Root{path: path} }

// Socket connects to the unix socket at rel below the root, bounded by ctx.
// rel is relative and inside the root (the root itself may be reached
// through symlinks: it is the operator's choice); no component of rel may
// be a symlink, the last must be a socket and, unless want is zero, that
// very file. Otherwise the error wraps ErrChanged, and nothing was
// connected to.
//
// On Linux all of that holds at the moment of connecting (see
// dial_linux.go, and Root for the descriptor it walks from); elsewhere the
// path is looked at just before connecting to it by name, and a swap in
// between is not caught (see dial_other.go).
func (r *Root) Socket(ctx context.Context, rel string, want Identity) (*net.UnixConn, error) {
	clean, err := inside(r.path, rel)
	if err != nil {
		return nil, err
	}
	if want == (Identity{}) {
		return socket(ctx, r.path, clean, want)
	}
	return r.held.socket(ctx, r.path, clean, want)
}

// Reopen lets go of the directory held: the next connection opens the one
// at the path now.
func (r *Root) Reopen() { r.held.release() }

// Close lets go of the directory held. Connections may still be made; each
// opens the directory again, and holds nothing.
func (r *Root) Close() { r.held.close() }

// Dialer connects to endpoints (unix socket paths). Its zero value connects
// to any endpoint. It is safe for concurrent use.
type Dialer struct {
	// Roots, if set, are the directories an endpoint must be in, symlinks
	// resolved, at every connection: the manager's Options.EndpointRoots.
	Roots []string
}

// For is the dialer of a plugin's endpoint: confined to roots, unless the
// endpoint is the plugin's registration socket, which the manager allows
// wherever roots are; that one is confined to its own directory, as the
// manager's connections to it are.
func For(endpoint, socket string, roots []string) Dialer {
	if filepath.Clean(endpoint) == filepath.Clean(socket) {
		return Dialer{Roots: []string{filepath.Dir(filepath.Clean(socket))}}
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
			c, err := socket(ctx, r, rel, Identity{})
			if errors.Is(err, errSymlink) {
				// Not the endpoint that was checked, and it may lead
				// out of the root.
				return nil, fmt.Errorf("endpoint %s changed while connecting: %w: %w", path, err, ErrOutside)
			}
			if err != nil {
				return nil, fmt.Errorf("endpoint %s: %w", path, err)
			}
			return c, nil
		}
	}
	return nil, fmt.Errorf("endpoint %s resolves to %s, %w (%s): not connecting", path, resolved, ErrOutside, strings.Join(d.Roots, ", "))
}

// Within reports whether path p is dir or inside it, lexically (see
// ResolveExisting for symlinks).
func Within(p, dir string) bool {
	p, dir = filepath.Clean(p), filepath.Clean(dir)
	if p == dir {
		return true
	}
	if !strings.HasPrefix(p, dir) {
		return false
	}
	// dir, then a separator: "/" ends in one; any other clean dir does not.
	// (The manager asks this of every filesystem event: nothing is built.)
	return strings.HasSuffix(dir, string(filepath.Separator)) || p[len(dir)] == filepath.Separator
}

// ResolveExisting resolves the symlinks of the longest part of path that
// exists, and keeps the rest as it is: a socket that does not exist yet is
// where the directories on the way to it lead.
func ResolveExisting(path string) string {
	if resolved, err := filepath.EvalSymlinks(path); err == nil {
		return resolved
	}
	parent := filepath.Dir(path)
	if parent == path {
		return path
	}
	return filepath.Join(ResolveExisting(parent), filepath.Base(path))
}

// beneath returns p relative to dir, if p is inside dir (not dir itself).
func beneath(p, dir string) (string, bool) {
	rel, err := filepath.Rel(dir, p)
	if err != nil || rel == "." || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return "", false
	}
	return rel, true
}
