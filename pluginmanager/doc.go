// Package pluginmanager registers node plugins the way the kubelet does, without
// the kubelet.
//
// A plugin (a CSI driver, a DRA driver, a device plugin, or anything of a type
// of your own) serves the kubelet's plugin registration gRPC service,
// k8s.io/kubelet/pkg/apis/pluginregistration/v1, on a unix socket it creates in
// a registry directory. A Manager watches that directory. For each socket it
// finds it calls GetInfo, hands the plugin to the Handler added for its type
// (Validate, then Register), and tells the plugin whether it was accepted with
// NotifyRegistrationStatus. When the socket disappears, or is replaced by a new
// one at the same path, the handler's Deregister lets the old plugin go.
//
//	m, err := pluginmanager.New(pluginmanager.Options{Dir: dir, Logger: logger, Registerer: reg})
//	m.AddHandler("CSIPlugin", csiHandler)
//	m.AddHandler("DRAPlugin", draHandler, pluginmanager.HandlerOptions{UnhealthyGrace: time.Minute})
//	err = m.Run(ctx) // until ctx is done
//
// HandlerOptions are the settings of one plugin type (grace period, probe
// interval, who may serve it); Options are the manager's, and the defaults of
// every type. With Options.Observe the manager only looks, beside another
// manager that registers the plugins (a kubelet): it calls no handler, only
// the Observers added with AddObserver.
//
// # How it differs from the kubelet's manager
//
// Registration is event-driven: a socket is registered within milliseconds of
// appearing, not on the next pass of a one-second loop; a periodic walk of the
// directory (Options.ResyncInterval) only repairs missed watch events.
//
// A socket's identity is the file itself: re-created at the same path, it is a
// new registration whose retries start afresh. Every connection to it (the
// first, after a hang-up, a probe's, a notification's again) reaches it from
// the registry directory following no symlink, and only while it is that
// very file (internal/confine): a socket swapped for a symlink, a FIFO or a
// file, seen by the watch or when connecting, is let go as if removed. A
// symlink in the directory is never a plugin. A socket path too long to
// connect to (over 107 bytes on Linux) is Rejected at once, reason dial.
//
// Failures are either terminal or transient. A plugin whose type has no
// handler, whose handler's Validate refuses it, that does not serve the
// Registration service, or whose GetInfo answer is malformed, is Rejected and
// left alone until its socket changes (or, for a missing handler, until
// AddHandler adds one). Anything else (a refused connection, a timeout, a
// Register error) is retried with exponential backoff and jitter.
//
// Every RPC and every handler call has a deadline, and everything a plugin
// sends is bounded in size.
//
// A registered plugin is watched, quietly. The manager holds the connection
// it registered over open and idle, so a plugin whose process dies is
// Unhealthy the moment the kernel hangs that connection up; a connection
// the plugin's server closes is replaced without a call, so nothing shows in
// the plugin's log. A handler may watch the plugin's own endpoint and say
// when it stops serving (EndpointReporter): the plugin is then Unhealthy,
// reason endpoint, in both modes. A GetInfo every Options.ProbeInterval
// (5 minutes by default) catches a plugin wedged while its connection
// stays up. An Unhealthy plugin is deregistered after its grace period. The
// kubelet never looks at a registered plugin again.
//
// Several sockets may register the same (type, name), as the old and new
// instances of a driver do during a rolling update; each is its own
// registration, and PluginStatus.Newest marks the most recent.
//
// # Seeing what happens
//
// Plugins returns a snapshot of every socket, with its state, last error,
// attempts and next retry, and what GetInfo last answered at its path
// (PluginStatus.LastAnswer), which a plugin restarted in place keeps until
// its new socket answers. Subscribe streams events in order; a slow
// subscriber loses events (and is told so) rather than slowing registration.
// With Options.Registerer set, the manager exports Prometheus metrics:
//
//	plugd_plugins{type,state}                           sockets known, by state
//	plugd_registration_attempts_total                   attempts started
//	plugd_registration_failures_total{type,reason}      failed attempts, by step
//	plugd_registration_latency_seconds{type}            socket discovered -> registered
//	plugd_deregistrations_total{type}                   plugins let go
//	plugd_sockets_over_limit_total                      sockets beyond Options.MaxSockets, not tracked
//	plugd_held_connections                              idle connections held to plugins
//	plugd_fd_reserve_hits_total                         connections not held, to keep file descriptors
//	plugd_fd_exhausted_total                            dials that failed for want of file descriptors
//
// A type label is the plugin's type when a handler exists for it and "other"
// otherwise, so that plugins cannot create series at will.
//
// The log says what changes, not each retry: a socket's failure is a
// warning when its state, reason or the gist of its error changes, and a
// retry that fails the same way (or the same failure within 5 minutes of
// recovering: a flap) is at debug level; at most 100 failure
// warnings are written a minute, and then one line says how many more
// there were; while failures go on unlogged, one line every 5 minutes says
// how many sockets are still failing. Everything is still in Plugins, the
// events and the metrics.
//
// The manager keeps max(64, limit/8) of the process's open-file limit free
// for dialling new registrations: beyond it, it holds no more idle
// connections, and the plugins without one are watched by their probes. A
// dial that fails for want of descriptors is retried, and not counted as
// the plugin's failure.
//
// # Inside
//
// Events are hints, and one queue owns time. The directory's watch, a kept
// connection hanging up, AddHandler, and a retry, probe or grace period
// falling due only put a socket's path in the queue
// (pluginmanager/internal/queue: de-duplicated, one worker per path, each
// path due now or at one time). A worker reconciles the path: it reads the
// socket file and the path's entry in the registry, does the one thing
// needed (register, probe, take back, forget), and returns when to look
// again, controller-runtime's reconcile result. Registering (the default,
// registrar.go) and observing (observe.go) are two reconcilers over the same
// parts, each named for what it is: the registry of entries (registry.go:
// one lock, taken twice per registration, events published in the order of
// the changes, nothing under it that waits on the world), the client of the
// plugins' registration service (client.go: confined dials, the calls, the
// kept connections of pluginmanager/internal/connset), the table of
// handlers and observers (read without a lock), and the sandbox handler
// calls run in. What a look does is decided by pure functions of what it
// knows (nextStep, stepOutcomeOf, decideFailure, judgeHealth, observeStep,
// lookVerdict), and done by the callers around them. Options.Clock is the
// time of all of it, so tests on a fake clock are exact; the deadlines of
// RPCs and handler calls are real time.
//
// The plugin side of the protocol is in package github.com/plugd/plugd/plugin;
// package github.com/plugd/plugd/plugintest runs the manager in tests.
package pluginmanager
