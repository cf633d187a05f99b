package deviceplugin

import (
	"context"
	"fmt"
	"time"

	plugdapi "github.com/plugd/plugd/api"
	"github.com/plugd/plugd/handlers/internal/endpointwatch"
	"github.com/plugd/plugd/pluginmanager"
)

var _ pluginmanager.Observer = (*Handler)(nil)

// observation is what Observe last saw of a plugin socket that another
// manager (a kubelet) registered: a snapshot, not a stream.
type observation struct {
	options PluginOptions
	devices []Device
	at      time.Time // of the last successful look
	lastErr string    // of the last look, if it failed
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
	look, ok := h.observed.Look()
	if !ok {
		return errClosed
	}
	var seen *observation
	var w *endpointwatch.Watch
	err := check(&p)
	if err == nil {
		seen, w, err = h.lookAt(ctx, p, look)
	}
	if err != nil {
		err = fmt.Errorf("observe device plugin %q at %s: %w", p.Name, p.Endpoint, err)
	}
	if !h.observed.Put(p, look, w, func(o *observation) *observation {
		if err == nil {
			return seen
		}
		// A failed look keeps the last inventory seen at the socket.
		if o == nil {
			o = &observation{}
		}
		o.lastErr = printable(err.Error())
		return o
	}) {
		return errClosed
	}
	return err
}

// lookAt reads p's options and first device list, and starts watching its
// endpoint.
func (h *Handler) lookAt(ctx context.Context, p pluginmanager.Plugin, look uint64) (*observation, *endpointwatch.Watch, error) {
	// open ties the stream to its first context: ending ctx ends it, and
	// close ends it at once after the first list.
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, devs, err := h.open(sctx, sctx, p)
	if err != nil {
		return nil, nil, err
	}
	s.close()
	w, err := h.observed.Watch(ctx, p, look, func(o *observation, err error) (changed bool) {
		if err == nil {
			return false // the next look reads the devices again
		}
		o.lastErr = printable(err.Error())
		return true
	})
	if err != nil {
		return nil, nil, err
	}
	return &observation{options: s.options, devices: devs, at: time.Now()}, w, nil
}

// Forget drops what Observe recorded for p's socket, and stops watching its
// endpoint: it is gone.
func (h *Handler) Forget(p pluginmanager.Plugin) {
	h.observed.Forget(p)
}

// observedDetailsLocked returns Details of an observed plugin, or nil.
// h.mu must be held.
func (h *Handler) observedDetailsLocked(p pluginmanager.Plugin) any {
	seen, o, ok := h.observed.FindLocked(p)
	if !ok {
		return nil
	}
	return plugdapi.DevicePluginObserved{
		Resource:   seen.Name,
		Endpoint:   seen.Endpoint,
		Observed:   true,
		Devices:    countByHealth(o.devices),
		Inventory:  cloneDevices(o.devices),
		Options:    o.options,
		LastError:  o.lastErr,
		ObservedAt: o.at,
	}
}
