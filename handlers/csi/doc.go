// Package csi is plugd's handler for CSI drivers, the plugins of type
// "CSIPlugin" that node-driver-registrar registers on a driver's behalf.
//
// Add it to a manager for that type:
//
//	h := csi.New(csi.Options{Logger: logger, Registerer: reg})
//	m.AddHandler(csi.Type, h)
//
// Like the kubelet's CSI handler, it accepts a driver that offers a CSI 1.x
// version (the highest wins), read as the kubelet reads it
// (k8s.io/apimachinery's HighestSupportedVersion: "1.0.0", "1.2", "v1.5.0";
// not "1"), then asks the driver about this node with
// NodeGetInfo. Unlike it:
//
//   - the driver name is checked against the spec, and a refusal says what was
//     offered and what would have been accepted;
//   - the driver is asked its name (GetPluginInfo), which must match the one
//     its registrar announced, and whether it is ready (Probe): a driver still
//     starting is retried rather than half-registered;
//   - every call has a deadline (Options.CallTimeout), and everything the
//     driver sends is bounded by the spec's limits;
//   - a driver may have several instances, one per registration socket, so that
//     a rolling restart of node-driver-registrar under a new socket neither is
//     refused nor, when the old socket goes, deregisters the driver. The rule
//     is on Handler.Validate.
//
// What the handler learns is recorded per instance: Handler.Drivers returns
// it all, and Handler.Details one instance, for plugd's status API. The
// connection to the driver is closed once it is registered; nothing in plugd
// consumes CSI drivers yet, so they are recorded only, where the kubelet keeps
// a client for its volume manager.
//
// It is also a pluginmanager.Observer (see Manager.AddObserver): with a
// manager in observe mode, on a node whose kubelet registers the drivers,
// Handler.Observe only reads (GetPluginInfo, Probe, NodeGetCapabilities,
// NodeGetInfo) and records each instance it sees answering, marked
// Observed; Handler.Forget drops it when its socket goes.
//
// With Options.Registerer set, the handler exports:
//
//	plugd_csi_drivers                    drivers registered
//	plugd_csi_driver_instances{driver}   instances of each registered driver
//	plugd_csi_calls_total{method,code}   CSI calls made, by gRPC status code
package csi
