package csi

import (
	"context"

	utilversion "k8s.io/apimachinery/pkg/util/version"

	"github.com/plugd/plugd/handlers/internal/endpointwatch"
	"github.com/plugd/plugd/pluginmanager"
)

var _ pluginmanager.Observer = (*Handler)(nil)

// Observe looks at a driver another manager (a kubelet) registered, for a
// manager in observe mode: it calls the driver's GetPluginInfo, Probe,
// NodeGetCapabilities and NodeGetInfo, all read-only, each with a deadline of
// Options.CallTimeout bounded by ctx, and records what it saw as an instance
// marked Observed, so that Drivers and Details show it. It closes the
// connection the calls went over before it returns, and from then on
// watches the endpoint as Register does (an idle connection, no calls),
// telling the manager when it goes and comes back, until Forget or the next
// Observe of the socket.
//
// Unlike Validate and Register, it refuses no instance for the sake of
// another: two instances of a driver, as during a rolling restart, are both
// recorded, the one first seen later being the active one. Its error names the
// call that failed and why ("driver not ready" for a Probe that says so), or
// what in the registrar's announcement is wrong; the socket's record is dropped
// then, since the driver does not answer as it should. Called again for the
// same socket, it replaces the record, keeping its first-seen time.
func (h *Handler) Observe(ctx context.Context, p pluginmanager.Plugin) error {
	info, endpoint, raw, v, err := h.observe(ctx, p)
	var w *endpointwatch.Watch
	if err == nil {
		w, err = h.watch(ctx, p, endpoint)
	}
	if err != nil {
		if h.forget(p.Socket) {
			h.log.Info("observed CSI driver does not answer", "driver", p.Name, "socket", p.Socket, "err", err)
		}
		return err
	}
	s := h.store(p, endpoint, raw, v, info, w, true)
	if s.changed {
		h.log.Info("CSI driver observed", "driver", p.Name, "socket", p.Socket, "endpoint", endpoint,
			"version", raw, "vendorVersion", info.vendorVersion, "nodeID", info.nodeID,
			"maxVolumes", info.maxVolumes, "topology", info.topology, "instances", s.instances)
	}
	return nil
}

// observe checks what the registrar announced, as Validate does, and asks
// the driver, as Register does.
func (h *Handler) observe(ctx context.Context, p pluginmanager.Plugin) (_ *nodeInfo, endpoint, raw string, _ *utilversion.Version, _ error) {
	if err := checkName(p.Name); err != nil {
		return nil, "", "", nil, err
	}
	raw, v, err := highestSupported(p.Name, p.Versions)
	if err != nil {
		return nil, "", "", nil, err
	}
	endpoint, err = endpointPath(p.Endpoint)
	if err != nil {
		return nil, "", "", nil, err
	}
	info, err := h.query(ctx, p, endpoint)
	if err != nil {
		return nil, "", "", nil, err
	}
	return info, endpoint, raw, v, nil
}

// Forget drops what Observe recorded for p.Socket, under whatever name: the
// socket is gone. It makes no call to the driver, and does nothing for a socket
// it does not know.
func (h *Handler) Forget(p pluginmanager.Plugin) {
	if h.forget(p.Socket) {
		h.log.Info("observed CSI driver gone", "driver", p.Name, "socket", p.Socket)
	}
}

// forget drops the records of socket, stops watching their endpoints, and
// reports whether there were any.
func (h *Handler) forget(socket string) bool {
	h.mu.Lock()
	dropped := h.dropLocked(socket)
	h.mu.Unlock()
	for _, w := range dropped {
		w.Stop()
	}
	return len(dropped) > 0
}
