package dra

import (
	"context"
	"fmt"
	"time"

	"github.com/plugd/plugd/api"
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
}

// ObservedStatus is what Details returns for a plugin seen in observe mode:
// the last look at it, not a registration (plugd's status API type).
type ObservedStatus = api.DRAObserved

// Observe looks at a DRA driver another manager registered, only reading:
// it connects to the endpoint, waits for the connection to be ready within
// Options.CallTimeout and ctx's deadline, and closes it, recording for the
// socket the driver, the service Validate would choose, and that it was
// reachable, as Details shows. A plugin offering no supported DRA service,
// or whose endpoint is not reachable, is an error. Unlike Register it keeps
// no connection and no driver state: Drivers does not show it.
func (h *Handler) Observe(ctx context.Context, p pluginmanager.Plugin) error {
	service, _, err := check(p)
	if err == nil {
		h.mu.Lock()
		closed := h.closed
		h.mu.Unlock()
		if closed {
			return ErrClosed
		}
		conn, cerr := h.connect(ctx, p)
		if cerr == nil {
			conn.Close()
		}
		err = cerr
	}

	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return ErrClosed
	}
	o := h.observed[p.Socket]
	if o == nil || o.plugin.Name != p.Name {
		o = &observation{}
		h.observed[p.Socket] = o
	}
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

// Forget drops what Observe recorded for p's socket: it is gone.
func (h *Handler) Forget(p pluginmanager.Plugin) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.observed[p.Socket]; ok {
		delete(h.observed, p.Socket)
		h.notifyLocked()
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
