package pluginmanager

import (
	"context"
	"sync"
)

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
