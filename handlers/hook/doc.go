// Package hook is a pluginmanager.Handler for plugin types plugd knows nothing
// about, configured without writing Go: each registration event runs a
// command, or POSTs to a URL, and the answer decides whether the plugin is
// taken.
//
//	h, err := hook.New(hook.Config{
//		Command: []string{"/usr/local/bin/accept-gpu-plugin"},
//		Events:  []string{"validate", "register", "deregister"},
//	}, hook.Options{Logger: logger, Registerer: reg})
//	m.AddHandler("example.com/GPUPlugin", h)
//
// # What the hook is given
//
// Every run is given the event and the plugin as JSON, on stdin for a command
// and as the body of the POST for a URL:
//
//	{"event":"register","plugin":{"type":"example.com/GPUPlugin","name":"gpu.example.com",
//	 "endpoint":"/var/lib/plugd/gpu.sock","versions":["v1"],"socket":"/var/lib/plugd/gpu.sock"}}
//
// A command also finds it in its environment, as PLUGD_EVENT,
// PLUGD_PLUGIN_TYPE, PLUGD_PLUGIN_NAME, PLUGD_PLUGIN_ENDPOINT,
// PLUGD_PLUGIN_VERSIONS (comma-separated) and PLUGD_PLUGIN_SOCKET. That
// environment is otherwise only PATH and HOME, as plugd has them, and
// Config.Env: plugd's own environment may hold credentials a hook has no need
// of, so a hook is given what its configuration says and nothing more.
//
// A command need not read stdin. It runs without a shell, in plugd's working
// directory, in its own process group. When the command
// exits, or its time is up, the whole group is killed, so neither a hook that
// hangs nor one that leaves a process behind in the background outlives its
// run. (A process that leaves the group, with setsid, is out of reach; a hook
// that means to start a daemon has to do that.)
//
// # How the answer is read
//
// A command accepts the plugin by exiting with status 0 and refuses it with
// any other exit status; a URL accepts with a 2xx response and refuses with a
// 4xx. What a refusal does depends on the event:
//
//   - validate: the plugin is rejected until its socket changes.
//   - register: the registration fails and is retried with backoff; exit
//     status 3, or a 4xx response, refuses it for good (the plugin is
//     rejected until its socket changes).
//   - deregister: the refusal is logged and counted; the plugin is let go all
//     the same.
//
// Anything else is the hook's trouble, not a verdict on the plugin, and is
// retried (or, for deregister, logged and counted like a refusal): a command that cannot be started, that is killed by a signal or
// that runs out of time; a URL that cannot be reached, that answers 5xx (or
// any other status) or that runs out of time. A validate hook in trouble lets
// the plugin through to Register, which then fails, to be retried, without
// running the register hook: Validate itself has no way to ask for a retry.
//
// The reason a refusal gives the plugin, and shows in plugd's status, is what
// the hook said: the end of what a command wrote to stderr (or to stdout, if
// it wrote nothing to stderr), or the start of a response's body; at most 512
// bytes of it, with control characters escaped.
//
// # What can be seen
//
// Details returns the last run for a plugin (event, result, exit or HTTP
// status, duration and the last 4 KiB of its output), for plugd's status API.
// With Options.Registerer set, the handler exports
//
//	plugd_hook_runs_total{event,result}      runs, by event and result: accepted, refused, error or timeout
//	plugd_hook_duration_seconds{event}       how long runs took
//
// Several handlers may share a Registerer; their runs are counted together.
package hook
