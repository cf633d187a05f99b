package deviceplugin

import (
	"context"
	"fmt"
	"time"

	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	plugdapi "github.com/plugd/plugd/api"
	"github.com/plugd/plugd/handlers/internal/endpointwatch"
	"github.com/plugd/plugd/internal/confine"
	"github.com/plugd/plugd/pluginmanager"
)

var _ pluginmanager.Observer = (*Handler)(nil)

// observation is what Observe last saw of a plugin socket that another
// manager (a kubelet) registered: a snapshot, not a stream.
type observation struct {
	plugin  pluginmanager.Plugin
	options PluginOptions
	devices []Device
	at      time.Time // of the last successful look
	lastErr string    // of the last look, if it failed
	watch   *endpointwatch.Watch
	look    uint64 // which Observe made it: the watch of another does not write to it
}

// Observe looks at a device plugin another manager registered, only
// reading: it dials the endpoint, calls GetDevicePluginOptions, opens a
// ListAndWatch stream just long enough to receive the first device list,
// closes it, and records that list for the socket, shown by Details. Each
// call is bounded by ctx and by Options.CallTimeout, and the list by the
// same bounds as Register's. The error names the call that failed.
//
// Unlike Register, it keeps no stream (a second ListAndWatch stream would
// take device updates from the kubelet's, with plugins that feed every
// stream from one channel), starts no grace period and does not make the
// plugin serve a resource: Resources does not show it. It then watches the
// endpoint (an idle connection, no calls) until Forget or the next Observe
// of the socket, telling the manager (pluginmanager.EndpointReporter) when
// it goes and comes back.
func (h *Handler) Observe(ctx context.Context, p pluginmanager.Plugin) error {
	if err := check(&p); err != nil {
		return h.observeFailed(p, err)
	}
	h.mu.Lock()
	closed := h.closed
	h.looks++
	look := h.looks
	h.mu.Unlock()
	if closed {
		return errClosed
	}
	// open ties the stream to its first context: ending ctx ends it, and
	// close ends it at once after the first list.
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, devs, err := h.open(sctx, sctx, p)
	if err != nil {
		return h.observeFailed(p, err)
	}
	s.close()
	w, err := h.watchObserved(ctx, p, look)
	if err != nil {
		return h.observeFailed(p, err)
	}

	h.mu.Lock()
	var old *endpointwatch.Watch
	defer func() {
		h.mu.Unlock()
		old.Stop() // without h.mu, which its reports take
	}()
	if h.closed {
		old = w
		return errClosed
	}
	if o := h.observed[p.Socket]; o != nil {
		old = o.watch
	}
	h.observed[p.Socket] = &observation{plugin: p, options: s.options, devices: devs, at: time.Now(), watch: w, look: look}
	h.notifyLocked()
	return nil
}

// watchObserved watches the endpoint of the observed plugin p, reporting
// what it sees to the manager, and in Details when it goes.
func (h *Handler) watchObserved(ctx context.Context, p pluginmanager.Plugin, look uint64) (*endpointwatch.Watch, error) {
	report := pluginmanager.EndpointReporter(ctx)
	return endpointwatch.Start(ctx, p.Endpoint, endpointwatch.Options{
		Timeout: h.opts.CallTimeout,
		Dial:    confine.For(p.Endpoint, p.Socket, h.opts.EndpointRoots).Dial,
		Report: func(err error) {
			report(err)
			if err == nil {
				return // the next look reads the devices again
			}
			h.mu.Lock()
			defer h.mu.Unlock()
			if o := h.observed[p.Socket]; o != nil && o.look == look {
				o.lastErr = printable(err.Error())
				h.notifyLocked()
			}
		},
	})
}

// observeFailed records that a look at p failed, keeping the last inventory
// seen at its socket, and returns the error to report.
func (h *Handler) observeFailed(p pluginmanager.Plugin, err error) error {
	err = fmt.Errorf("observe device plugin %q at %s: %w", p.Name, p.Endpoint, err)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return err
	}
	o := h.observed[p.Socket]
	if o == nil || o.plugin.Name != p.Name {
		o = &observation{}
		h.observed[p.Socket] = o
	}
	o.plugin = p
	o.lastErr = printable(err.Error())
	h.notifyLocked()
	return err
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

// observedDetailsLocked returns Details of an observed plugin, or nil.
// h.mu must be held.
func (h *Handler) observedDetailsLocked(p pluginmanager.Plugin) any {
	o := h.observed[p.Socket]
	if o == nil || o.plugin.Name != p.Name {
		return nil
	}
	counts := map[string]int{api.Healthy: 0, api.Unhealthy: 0}
	for _, d := range o.devices {
		counts[d.Health]++
	}
	return plugdapi.DevicePluginObserved{
		Resource:   o.plugin.Name,
		Endpoint:   o.plugin.Endpoint,
		Observed:   true,
		Devices:    counts,
		Inventory:  cloneDevices(o.devices),
		Options:    o.options,
		LastError:  o.lastErr,
		ObservedAt: o.at,
	}
}
