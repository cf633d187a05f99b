// Package plugin is the plugin-side SDK for plugd.
//
// A plugin announces itself to a plugin manager (plugd, or a kubelet, which
// speaks the same protocol) by serving the gRPC service
// pluginregistration.Registration on a unix socket inside the registry
// directory the manager watches. The manager finds the socket, asks the
// plugin who it is with GetInfo, and reports the outcome with
// NotifyRegistrationStatus.
//
// [Start] (or [Serve], which also blocks until its context is done) does all
// of that with one call:
//
//   - it validates the [Config] (versions included: plugd's handlers and the
//     kubelet's refuse a plugin that lists none) and creates the registry
//     directory if needed;
//   - it replaces a stale socket left by an earlier run of the same plugin
//     (one nobody listens on), but refuses one a plugin answers on
//     ([ErrInUse]: another instance runs) and anything that is not a socket;
//   - it listens in a hidden directory of its own inside the registry
//     directory, which managers skip and a kubelet does not watch, and links
//     the socket into place, so the manager never sees a socket that is not
//     yet accepting connections, nor any other name created;
//   - it answers GetInfo from the Config and records every status the
//     manager sends, which [Server.Status], [Server.Registered] and
//     [Server.WaitRegistered] expose.
//
// [Config.Services] lets a plugin serve its own gRPC services (a device
// plugin, say) on the same socket. [Server.Close] stops serving, giving
// in-flight calls a bounded grace period, and removes the socket only if it
// is still the one this Server created, so a restarted plugin that already
// took over the name keeps its registration.
package plugin
