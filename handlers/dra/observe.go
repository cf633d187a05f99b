package dra

import (
	"context"
	"fmt"
	"time"

	"github.com/plugd/plugd/api"
	"github.com/plugd/plugd/handlers/internal/endpointwatch"
	"github.com/plugd/plugd/internal/confine"
	"github.com/plugd/plugd/pluginmanager"
)

var _ pluginmanager.Observer = (*Handler)(nil)

// observation is what Observe last saw of a registration socket that another
// manager (a kubelet) registered.
type observation struct {
	plugin      pluginmanager.Plugin
	service     string
	reachable   bool
	reachableAt time.Time // of the last look that reached the endpoint
	lastErr     string    // of the last look, if it failed
	watch       *endpointwatch.Watch
	look        uint64 // which Observe made it: the watch of another does not write to it
}

// ObservedStatus is what Details returns for a plugin seen in observe mode:
// the last look at it, not a registration (plugd's status API type).
type ObservedStatus = api.DRAObserved

// Observe looks at a DRA driver another manager registered, only reading:
// it connects to the endpoint and waits for its HTTP/2 handshake within
// Options.CallTimeout and ctx's deadline, recording for the socket the
// driver, the service Validate would choose, and that it was reachable, as
// Details shows. A plugin offering no supported DRA service, or whose
// endpoint is not reachable, is an error. Unlike Register it keeps no
// driver state: Drivers does not show it. It keeps that connection, idle
// (no calls), and watches it until Forget or the next Observe of the
// socket, telling the manager (pluginmanager.EndpointReporter) and Details
// when the endpoint goes and comes back.
func (h *Handler) Observe(ctx context.Context, p pluginmanager.Plugin) error {
	service, _, err := check(&p)
	h.mu.Lock()
	closed := h.closed
	h.looks++
	look := h.looks
	h.mu.Unlock()
	if closed {
		return ErrClosed
	}
	var w *endpointwatch.Watch
	if err == nil {
		w, err = h.watchObserved(ctx, p, look)
	}

	h.mu.Lock()
	var old *endpointwatch.Watch
	defer func() {
		h.mu.Unlock()
		old.Stop() // without h.mu, which its reports take
	}()
	if h.closed {
		old = w
		return ErrClosed
	}
	o := h.observed[p.Socket]
	if o == nil || o.plugin.Name != p.Name {
		if o != nil {
			old = o.watch
		}
		o = &observation{}
		h.observed[p.Socket] = o
	} else {
		old = o.watch
	}
	o.watch, o.look = w, look
	o.plugin, o.service = p, service
	o.reachable = err == nil
	if err != nil {
		err = fmt.Errorf("observe DRA driver %q: %w", p.Name, err)
		o.lastErr = printable(err.Error(), maxMessageLen)
	} else {
		o.lastErr = ""
		o.reachableAt = h.opts.Clock.Now()
	}
	h.notifyLocked()
	return err
}

// watchObserved watches the endpoint of the observed plugin p, reporting
// what it sees to the manager and in Details.
func (h *Handler) watchObserved(ctx context.Context, p pluginmanager.Plugin, look uint64) (*endpointwatch.Watch, error) {
	report := pluginmanager.EndpointReporter(ctx)
	return endpointwatch.Start(ctx, p.Endpoint, endpointwatch.Options{
		Timeout: h.opts.CallTimeout,
		Dial:    confine.For(p.Endpoint, p.Socket, h.opts.EndpointRoots).Dial,
		Report: func(err error) {
			report(err)
			h.mu.Lock()
			defer h.mu.Unlock()
			o := h.observed[p.Socket]
			if o == nil || o.look != look {
				return
			}
			o.reachable = err == nil
			if err != nil {
				o.lastErr = printable(err.Error(), maxMessageLen)
			} else {
				o.lastErr = ""
				o.reachableAt = h.opts.Clock.Now()
			}
			h.notifyLocked()
		},
	})
}

// Forget drops what Observe recorded for p's socket, and stops watching its
// endpoint: it is gone.
func (h *Handler) Forget(p pluginmanager.Plugin) {
	h.mu.Lock()
	o, ok := h.observed[p.Socket]
	if ok {
		delete(h.observed, p.Socket)
		h.notifyLocked()
	}
	h.mu.Unlock()
	if ok {
		o.watch.Stop()
	}
}

// observedLocked returns Details of an observed plugin as an
// *ObservedStatus, or nil. h.mu must be held.
func (h *Handler) observedLocked(p pluginmanager.Plugin) any {
	o := h.observed[p.Socket]
	if o == nil || o.plugin.Name != p.Name {
		return nil
	}
	return &ObservedStatus{
		Driver:      o.plugin.Name,
		Endpoint:    o.plugin.Endpoint,
		Service:     o.service,
		Observed:    true,
		Reachable:   o.reachable,
		ReachableAt: o.reachableAt,
		LastError:   o.lastErr,
	}
}
