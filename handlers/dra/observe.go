package dra

import (
	"context"
	"fmt"
	"time"

	"github.com/plugd/plugd/api"
	"github.com/plugd/plugd/handlers/internal/endpointwatch"
	"github.com/plugd/plugd/pluginmanager"
)

var _ pluginmanager.Observer = (*Handler)(nil)

// observation is what Observe last saw of a registration socket that another
// manager (a kubelet) registered.
type observation struct {
	service     string
	reachable   bool
	reachableAt time.Time // of the last look that reached the endpoint
	lastErr     string    // of the last look, if it failed
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
	look, ok := h.observed.Look()
	if !ok {
		return ErrClosed
	}
	var w *endpointwatch.Watch
	if err == nil {
		w, err = h.observed.Watch(ctx, p, look, h.seen)
	}
	if err != nil {
		err = fmt.Errorf("observe DRA driver %q: %w", p.Name, err)
	}
	if !h.observed.Put(p, look, w, func(o *observation) *observation {
		if o == nil {
			o = &observation{}
		}
		o.service = service
		h.seen(o, err)
		return o
	}) {
		return ErrClosed
	}
	return err
}

// seen records in o whether a look at its endpoint, or its watch, found it
// reachable (err is nil) or not.
func (h *Handler) seen(o *observation, err error) (changed bool) {
	o.reachable = err == nil
	if err != nil {
		o.lastErr = printable(err.Error(), maxMessageLen)
	} else {
		o.lastErr = ""
		o.reachableAt = h.opts.Clock.Now()
	}
	return true
}

// Forget drops what Observe recorded for p's socket, and stops watching its
// endpoint: it is gone.
func (h *Handler) Forget(p pluginmanager.Plugin) {
	h.observed.Forget(p)
}

// observedLocked returns Details of an observed plugin as an
// *ObservedStatus, or nil. h.mu must be held.
func (h *Handler) observedLocked(p pluginmanager.Plugin) any {
	seen, o, ok := h.observed.FindLocked(p)
	if !ok {
		return nil
	}
	return &ObservedStatus{
		Driver:      seen.Name,
		Endpoint:    seen.Endpoint,
		Service:     o.service,
		Observed:    true,
		Reachable:   o.reachable,
		ReachableAt: o.reachableAt,
		LastError:   o.lastErr,
	}
}
