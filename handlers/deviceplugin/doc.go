// Package deviceplugin is the plugd handler for plugins of type
// "DevicePlugin": the kubelet's device manager, without the scheduling.
//
// A device plugin registers through the plugin manager with its extended
// resource name (vendor.example/gpu) as its name and "v1beta1" among its
// versions. The handler then dials the plugin's endpoint, asks for its
// options with GetDevicePluginOptions, and keeps a ListAndWatch stream open
// for as long as the plugin is registered: every message replaces that
// plugin instance's device list, with each device's health and NUMA
// topology, and the resource shows the list of the instance that serves it
// (see below). Register returns once the first list arrived, so a registered
// plugin's devices are known.
//
//	h := deviceplugin.New(deviceplugin.Options{Logger: logger, Registerer: reg})
//	defer h.Close()
//	m.AddHandler(deviceplugin.Type, h)
//	...
//	for _, r := range h.Resources() { ... }
//
// # How it differs from the kubelet
//
// When a stream breaks (the plugin died, or its connection was lost), all of
// the resource's devices turn Unhealthy at once, and the handler redials with
// backoff. If the plugin is back within Options.GracePeriod, its new list
// replaces the old one; if not, the resource is dropped: its devices are gone
// and Resource.Dropped says so, until a stream is established again. The
// backoff grows with every stream that breaks soon after it opened, and
// starts again only once one stayed up longer than
// Options.ReconnectBackoffMax, so a plugin that keeps ending its stream is
// redialed ever more slowly rather than in a loop.
//
// When the socket of a resource's last instance goes, as it does on a clean
// stop or a restart of the plugin, the devices turn Unhealthy at once too,
// and the resource stays, disconnected, for the grace period. A new
// registration of the resource within that time, such as the restarted
// plugin's, takes it over with its own device list; if none comes, the
// resource is dropped and leaves Resources.
//
// Several sockets may register the same resource, as the old and new
// instances of a plugin do during a rolling update. The kubelet refuses a
// second registration; here the newest instance serves the resource, and an
// older one is dropped once its stream ends or its socket goes. If the newest
// goes first, the one registered before it serves again.
//
// Every call to a plugin has a deadline (Options.CallTimeout), and what a
// plugin sends is bounded: at most 10,000 devices and 4 MiB per message,
// device IDs of printable characters and at most 256 bytes. A first device
// list that breaks a bound, or a plugin that does not serve the v1beta1
// DevicePlugin service at all, is rejected until its socket changes. A later
// list that breaks a bound is not applied: it ends the stream as a break
// does, so the devices of the last good list turn Unhealthy and the handler
// redials with backoff. A redial whose first list is bad counts as a failed
// attempt, so a plugin that goes on sending bad lists is dropped after the
// grace period, and redialed until it sends a good one. Lists are taken at
// a pace of 1 MiB a second (4 MiB at once, each list counted as at least
// 1 KiB): a plugin that sends faster waits in its own Send, held back by
// gRPC's flow control with a window of 1 MiB, and is logged once. With
// Options.EndpointRoots, every connection to the endpoint, redials
// included, is checked to lead inside them.
//
// # Seeing what happens
//
// Resources returns a snapshot of every resource, Changed wakes a watcher
// when it changes, and Details describes one plugin instance for plugd's
// status API. With Options.Registerer set, the handler exports:
//
//	plugd_deviceplugin_devices{resource,health}          devices of each resource, by health
//	plugd_deviceplugin_connected{resource}               1 while the serving instance's stream is up
//	plugd_deviceplugin_stream_reconnects_total{resource} streams re-established after a break
//
// Only resources that are registered, or within the grace period after their
// last instance deregistered, and not dropped appear, so a plugin creates no
// more series than it had sockets within the grace period.
package deviceplugin
