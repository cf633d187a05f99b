package pluginmanager

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"

	"github.com/plugd/plugd/internal/confine"
)

// MaxEndpointPath is the length an endpoint's path must stay below: a unix
// socket's address (sun_path) holds 108 bytes, its terminating NUL
// included, on Linux and Windows, 104 on macOS; a longer path cannot be
// dialed by name (the same bound as registration sockets').
const MaxEndpointPath = confine.MaxPath + 1

// EndpointPath is the one rule for a plugin's endpoint, which the manager
// and every handler in this module apply: an absolute path, or "unix://"
// and an absolute path (node-driver-registrar sends the former, some
// registrars the latter), of printable characters without spaces, shorter
// than MaxEndpointPath once clean. It returns the path, clean (the prefix
// removed, "." and ".." resolved lexically, as filepath.Clean does), or an
// error that says what is wrong. The manager hands handlers and observers
// a Plugin whose Endpoint is already that path; a handler used on its own
// calls EndpointPath, so that it accepts what the manager accepts. An empty
// endpoint is an error here: the manager takes it as the registration
// socket before it applies the rule.
func EndpointPath(endpoint string) (string, error) {
	path := strings.TrimPrefix(endpoint, unixScheme)
	switch {
	case endpoint == "":
		return "", errors.New("the endpoint is empty")
	case len(endpoint) > maxEndpointLen:
		return "", fmt.Errorf("the endpoint is %d bytes long, at most %d are allowed", len(endpoint), maxEndpointLen)
	case !token(endpoint):
		return "", fmt.Errorf("endpoint %.64q has a character that is not printable or is a space", endpoint)
	case !filepath.IsAbs(path):
		return "", fmt.Errorf("endpoint %.64q is not an absolute path (or %s and an absolute path, such as %s/run/plugin.sock)", endpoint, unixScheme, unixScheme)
	}
	path = filepath.Clean(path)
	if len(path) >= MaxEndpointPath {
		return "", fmt.Errorf("endpoint %.64q... is %d bytes long; a unix socket path must be shorter than %d bytes: serve the plugin at a shorter path", path, len(path), MaxEndpointPath)
	}
	return path, nil
}

// unixScheme is the prefix of an endpoint given as a URL.
const unixScheme = "unix://"

// EndpointReporter returns the function with which a Handler's Register, or
// an Observer's Observe, tells the manager whether the plugin's own endpoint
// serves: called with nil, it serves (again); with an error, it stopped, and
// the error says why. A handler that watches its plugins' endpoints (a CSI
// driver's socket, a DRA or device plugin service: the handler's connection
// or stream there breaking) keeps the function with what it holds for the
// plugin and calls it at every change, from any goroutine, starting with
// nil once it watches a serving endpoint. It never blocks; calls after the
// plugin was let go (Deregister, Forget, a new socket, or the next Observe of
// the same socket) are ignored, as are calls outside Register and Observe:
// for any other ctx it returns a function that does nothing.
//
// What the manager makes of it, in both modes: a plugin whose endpoint is
// reported down is Unhealthy (NotAnswering when observing), reason
// endpoint, and a registered one is deregistered once that has lasted its
// grace period (HandlerOptions.UnhealthyGrace); reported serving again, it
// is Registered (Answering) again. And a plugin whose registration socket
// stops answering while its endpoint is reported serving (its registrar,
// such as node-driver-registrar, died and left its socket) stays
// registered, as it would with the kubelet, unless its type's
// HandlerOptions.DeregisterWithRegistrar says otherwise. A handler that
// never reports leaves liveness to the registration socket alone.
func EndpointReporter(ctx context.Context) func(err error) {
	if w, ok := ctx.Value(endpointKey{}).(*endpointWatch); ok {
		return w.report
	}
	return func(error) {}
}

type endpointKey struct{}

// endpointWatch is what the handler of one registration (or one observer's
// look) reported of the plugin's endpoint. Its methods are safe for
// concurrent use, and on a nil *endpointWatch (no report, ever).
type endpointWatch struct {
	path  string
	queue func(path string)

	mu    sync.Mutex
	ended bool
	known bool  // something was reported
	err   error // the last report
}

func newEndpointWatch(path string, queue func(string)) *endpointWatch {
	return &endpointWatch{path: path, queue: queue}
}

// with is ctx carrying w, for the handler call it reports from.
func (w *endpointWatch) with(ctx context.Context) context.Context {
	return context.WithValue(ctx, endpointKey{}, w)
}

func (w *endpointWatch) report(err error) {
	w.mu.Lock()
	if w.ended {
		w.mu.Unlock()
		return
	}
	changed := !w.known || (w.err == nil) != (err == nil)
	w.known, w.err = true, err
	w.mu.Unlock()
	if changed {
		w.queue(w.path) // look at the plugin again
	}
}

// state is what was reported last: whether anything was, and whether the
// endpoint was down then (nil: it serves, or nothing was reported).
func (w *endpointWatch) state() (known bool, down error) {
	if w == nil {
		return false, nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.known, w.err
}

// end makes every later report ignored: the registration it was for ended.
func (w *endpointWatch) end() {
	if w == nil {
		return
	}
	w.mu.Lock()
	w.ended = true
	w.mu.Unlock()
}
