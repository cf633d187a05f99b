package dra

import (
	"context"
	"fmt"
	"time"

	drahealthv1 "k8s.io/kubelet/pkg/apis/dra-health/v1"

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
	service, health, err := check(&p)
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
	if err == nil {
		h.followObserved(p, health)
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
	h.mu.Lock()
	f := h.followed[p.Socket]
	delete(h.followed, p.Socket)
	h.mu.Unlock()
	if f != nil {
		f.cancel()
	}
}

// observedHealth is the health stream plugd follows of a DRA driver it
// observes: the kubelet opens its own stream to the driver, and
// kubeletplugin serves each stream its own reports. Opening one is a read;
// it tells plugd's node agent which devices are Unhealthy.
type observedHealth struct {
	endpoint, service string
	d                 *driver // its devices' health
	cancel            context.CancelFunc
}

// followObserved follows the health stream of p, observed, when it offers
// one (health, the service), from its endpoint: one stream per socket,
// started again when the endpoint or service changes, ended by Forget and
// Close.
func (h *Handler) followObserved(p pluginmanager.Plugin, health string) {
	h.mu.Lock()
	old := h.followed[p.Socket]
	if h.closed || old != nil && old.endpoint == p.Endpoint && old.service == health {
		h.mu.Unlock()
		return
	}
	delete(h.followed, p.Socket)
	h.mu.Unlock()
	if old != nil {
		old.cancel()
	}
	if health == "" {
		return
	}
	conn, _, err := h.newConn(p)
	if err != nil {
		h.log.Debug("DRA health stream not followed", "driver", p.Name, "socket", p.Socket, "error", err)
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	f := &observedHealth{endpoint: p.Endpoint, service: health, cancel: cancel,
		d: &driver{name: p.Name, devices: make(map[deviceKey]*device)}}
	h.mu.Lock()
	if h.closed || h.followed[p.Socket] != nil {
		h.mu.Unlock()
		cancel()
		conn.Close()
		return
	}
	h.followed[p.Socket] = f
	h.wg.Add(1)
	h.mu.Unlock()
	src := healthSource{conn: conn, service: health, driver: p.Name, socket: p.Socket,
		record: func(r *drahealthv1.NodeWatchResourcesResponse) {
			h.mu.Lock()
			defer h.mu.Unlock()
			if h.followed[p.Socket] == f {
				h.recordDevicesLocked(f.d, r)
				h.notifyLocked()
			}
		},
		unsupported: func(error) {
			h.mu.Lock()
			defer h.mu.Unlock()
			if h.followed[p.Socket] == f {
				f.service = ""
				h.notifyLocked()
			}
		}}
	go func() {
		defer h.wg.Done()
		defer conn.Close()
		h.followHealth(ctx, src)
	}()
}

// observedLocked returns Details of an observed plugin as an
// *ObservedStatus, or nil. h.mu must be held.
func (h *Handler) observedLocked(p pluginmanager.Plugin) any {
	seen, o, ok := h.observed.FindLocked(p)
	if !ok {
		return nil
	}
	s := &ObservedStatus{
		Driver:      seen.Name,
		Endpoint:    seen.Endpoint,
		Service:     o.service,
		Observed:    true,
		Reachable:   o.reachable,
		ReachableAt: o.reachableAt,
		LastError:   o.lastErr,
	}
	if f := h.followed[p.Socket]; f != nil {
		s.HealthService, s.Devices = f.service, f.d.deviceHealth(h.opts.Clock.Now())
	}
	return s
}
