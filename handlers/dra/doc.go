// Package dra is plugd's handler for Dynamic Resource Allocation drivers:
// plugins of type "DRAPlugin", such as those built with
// k8s.io/dynamic-resource-allocation/kubeletplugin. It does what the kubelet's
// DRA plugin handler does, and shows what it knows.
//
//	h := dra.New(dra.Options{Logger: logger, Registerer: reg})
//	defer h.Close()
//	m.AddHandler(dra.Type, h)
//
// # What it accepts
//
// Validate accepts a driver whose name is a DNS subdomain, whose endpoint is an
// absolute path shorter than 108 bytes (a unix socket's limit), and whose
// versions, which for DRA are gRPC service names, include "v1.DRAPlugin" or
// "v1beta1.DRAPlugin": the first of those in the plugin's order is used. Any
// other plugin is rejected with a message saying which rule it broke.
//
// Register connects to the endpoint and waits, within Options.CallTimeout, for
// the connection to be ready, so a driver whose DRA service is not reachable is
// refused (and retried by the manager) rather than registered blind.
//
// # Instances, connections, availability
//
// A driver may register several instances, each with its own registration
// socket, as kubeletplugin does during a rolling update (its RollingUpdate
// option). The handler keeps a connection to every instance and watches its
// state; the newest connected instance serves the driver. An instance that
// loses its connection is marked disconnected and reconnects by itself when
// its endpoint comes back. A driver left without any connected instance for
// Options.GracePeriod (30s, as in the kubelet) is reported unavailable, and
// available again as soon as an instance reconnects. A driver whose instances
// have all been deregistered is forgotten after the grace period, so a driver
// restarting in place never looks unavailable.
//
// # Device health
//
// An instance that advertises "v1.DRAResourceHealth" or
// "v1alpha1.DRAResourceHealth" (kubeletplugin does by default) is asked for a
// NodeWatchResources stream, in v1 if it advertises both (whatever its
// order, as the kubelet chooses since v1.37), and the health of every device it reports is
// recorded, up to 1024 devices per driver; further devices are counted in
// Driver.DevicesDropped and not followed. A report may be at most 256 KiB,
// and reports are taken at a pace of 512 KiB a second (1 MiB at once, each
// counted as at least 1 KiB): a driver that sends faster waits in its own
// Send, held back by gRPC's flow control with a window of 1 MiB. A
// device not refreshed within its health check timeout (30s unless the driver
// says otherwise, at most an hour) is reported Unknown, as the kubelet does. A
// driver that answers Unimplemented, which is what kubeletplugin does for a
// driver without health reporting, is not asked again. Pool and device names
// and messages are shown with every character that is not printable written
// as a Go escape, and cut to a bounded length.
//
// # Seeing what happens
//
// Drivers returns a snapshot of every driver, its instances and devices;
// Details describes the instance behind one registration socket, for plugd's
// status API. With Options.Registerer set, the handler exports:
//
//	plugd_dra_instances{state}       instances, "connected" or "disconnected"
//	plugd_dra_drivers                drivers known
//	plugd_dra_drivers_available      drivers available
//	plugd_dra_devices{health}        devices by reported health
//
// No series carries a driver's name: plugins choose their names, and must not
// be able to create series at will.
package dra
