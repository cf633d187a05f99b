package pluginmanager

import (
	"fmt"
	"log/slog"
	"path/filepath"
	"runtime"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"

	"github.com/plugd/plugd/internal/peercred"
)

// Options configure a Manager. Only Dir is required; the zero value of every
// other field means the default written beside it.
type Options struct {
	// Dir is the registry directory plugins put their sockets in, watched
	// recursively. It is created (0750) if missing. The kubelet's is
	// /var/lib/kubelet/plugins_registry.
	Dir string

	// Logger receives the manager's logs. Nil discards them.
	Logger *slog.Logger

	// Registerer, if set, receives the manager's Prometheus metrics. The manager
	// never uses the global registry.
	Registerer prometheus.Registerer

	// Workers bounds how many sockets are worked on at once. Zero means 128:
	// a plugin that accepts and says nothing holds a worker until its
	// deadlines pass, and a burst of sockets (a node's plugins starting
	// together) registers faster with more of its round trips in flight
	// (bench/README.md: a burst of 5000 took 5 % less time with 128 than
	// with 64). An idle worker is a parked goroutine; what a busy one used
	// (about 20 KiB: its stack, its call's buffers) the process keeps once
	// the burst is over. 256 were 4 % faster again, but with probes every
	// 10 s took plugd's memory at 5000 plugins past half the kubelet's.
	Workers int

	// ResyncInterval is how often the directory is walked again to repair
	// missed or overflowed watch events. Zero means 30s; negative disables it.
	// A mount over a directory of sockets (mount --bind), or its umount,
	// makes no watch event: on Linux the manager watches the mount table
	// and walks the directory again within a moment of such a change;
	// elsewhere the resync is what finds it.
	ResyncInterval time.Duration

	// BackoffInitial is the delay before the first retry of a failed
	// registration; each further failure doubles it, with jitter, up to
	// BackoffMax. Zero means 500ms and 2m.
	BackoffInitial time.Duration
	BackoffMax     time.Duration

	// DialTimeout bounds connecting to a registration socket, and the
	// plugin's HTTP/2 handshake (its SETTINGS). A refused connection fails
	// at once. Zero means 5s.
	DialTimeout time.Duration
	// GetInfoTimeout bounds the GetInfo call. On a new connection GetInfo
	// is sent with the handshake, to save a round trip, so the handshake
	// also has to be done within it. Zero means 5s.
	GetInfoTimeout time.Duration
	// NotifyTimeout bounds each NotifyRegistrationStatus call. Zero means 5s.
	NotifyTimeout time.Duration
	// HandlerTimeout bounds each call of a Handler method. Zero means 30s.
	HandlerTimeout time.Duration

	// EventBuffer is how many events each subscriber may fall behind before it
	// is told it lost some. Zero means 1024.
	EventBuffer int

	// EventHistory is how many recent events are kept for
	// SubscribeWithReplay. Zero means 1024.
	EventHistory int

	// Observe makes the manager an observer, for a node whose plugins
	// another manager (a kubelet) registers: it discovers sockets and asks
	// each GetInfo (at once, then every ProbeInterval, holding the
	// connection meanwhile to hear at once of its hang-up), asks the Observer
	// added for the plugin's type (AddObserver) to look too, and reports
	// what it sees (Answering, NotAnswering, Stale; an event per look), but
	// never notifies a plugin, never calls a handler, and never creates,
	// removes or changes a file; the registry directory may be mounted
	// read-only. Handlers added are not used.
	Observe bool

	// ProbeInterval is how often each registered (or, observing, each
	// answering) plugin is asked GetInfo as a routine probe, start to start,
	// with jitter; probes due within a tenth of it (at most a second) run
	// together. Zero means DefaultProbeInterval, 5 minutes; negative, no
	// routine probes. HandlerOptions.ProbeInterval overrides it for a type.
	//
	// Probes are the lesser signal. The manager holds the connection each
	// plugin registered over open and idle, and hears at once when it is
	// hung up (the kernel closes it when the plugin's process goes; a
	// server that stops sends GOAWAY): it then connects again, with no
	// call, so nothing shows in the plugin's log, and a plugin that no
	// longer accepts is Unhealthy at once. A handler may watch the
	// plugin's own endpoint too (EndpointReporter). What probes add is a
	// plugin wedged while its connection stays up: one that fails a probe
	// is Unhealthy at once, and asked again every interval; one that
	// answers with different info is a new plugin. An observing manager's
	// probe is a look: GetInfo, and its Observer's.
	ProbeInterval time.Duration

	// UnhealthyGrace is how long an Unhealthy plugin stays registered
	// before it is deregistered; it is registered again as soon as it
	// answers. Zero means 30s; negative, for ever: an Unhealthy plugin stays
	// registered until its socket goes, as with the kubelet.
	// HandlerOptions.UnhealthyGrace overrides it for a plugin type.
	UnhealthyGrace time.Duration

	// MaxSockets bounds how many sockets the manager tracks; more are left
	// alone (logged, and counted in plugd_sockets_over_limit_total) until
	// some go. Zero means 20000.
	MaxSockets int

	// EndpointRoots, if set, confines plugins' endpoints: an endpoint must
	// be inside one of these directories (after symlinks are resolved), or
	// be the registration socket itself. A plugin whose endpoint is not is
	// Rejected with reason policy.
	EndpointRoots []string

	// AllowedPeers, if set, says which processes may serve registration
	// sockets: the process listening on the socket (as the kernel reports
	// it: SO_PEERCRED on Linux, LOCAL_PEERCRED on macOS) must run as one of
	// its UIDs or GIDs. It applies to every plugin type whose
	// HandlerOptions.AllowedPeers is not set, types without a handler
	// included. Nil: anyone may. Windows does not tell who listens on a
	// unix socket: New refuses it there.
	AllowedPeers *Peers

	// AllowWritableDir lets Run use a registry directory that users other
	// than plugd's and root may change. Off, Run refuses, naming the
	// directory at fault and what to do, a registry directory
	//   - that users other than its owner may write to: anyone who can write
	//     there can plant a plugin or replace one;
	//   - that belongs to another user than plugd's or root, or is reached
	//     through a directory or symlink that does: its owner can make it
	//     writable, or rename it;
	//   - that is reached through a directory users other than its owner may
	//     write to and which has no sticky bit (a 0777 parent; /tmp's 1777
	//     is fine): anyone could rename the registry directory away and put
	//     their own in its place.
	// Symlinks on the way are followed, each checked where it is. This one
	// setting accepts all three: "others may change what is in here".
	//
	// Directories below the registry directory, whose sockets are
	// registered as the kubelet registers them, are held to the registry
	// directory's own rule: one that belongs to another user, or that users
	// other than its owner may write to, is left out (not watched, nothing
	// in it registered, what was registered let go), with a warning that
	// names it and the fix, until a chmod or chown makes it safe (seen at
	// once on Linux, at the next resync on darwin, whose kqueue reports no
	// attribute change of a directory not watched). AllowWritableDir
	// accepts those too.
	//
	// An observer (Observe) is not refused but warned, once, at Run: the
	// directory is the other manager's, which uses it as it is, so what the
	// observer reports is what that manager sees. The kubelet's own layout
	// (/var/lib/kubelet/plugins_registry, root's, mode 0750, in root's
	// /var/lib/kubelet) passes. On Windows, where who may change a directory
	// is its ACL, which plugd does not read, nothing is checked.
	AllowWritableDir bool

	// RemoveStaleAfter, if positive, removes a Stale socket (nobody listens
	// on it) once it is older than this: a crashed plugin's leftover. Off
	// by default: a plugin that comes back replaces its socket anyway.
	RemoveStaleAfter time.Duration

	// DeregisterOnShutdown makes Run deregister every registered plugin before
	// it returns. Off by default, so that restarting the manager does not make
	// the plugins' handlers flap.
	DeregisterOnShutdown bool

	// Clock is the manager's time: when retries, probes and grace periods
	// fall due, the periodic resync, and the times it reports. Tests set a
	// fake one (k8s.io/utils/clock/testing) to make time pass exactly. The
	// deadlines of RPCs and handler calls are real time whatever it is.
	// So are the first 15 ms of connecting to a socket that just appeared
	// and refuses (bound, not listening yet); its quiet retries after that
	// are due by this clock, from 20 ms on: a test on a fake clock whose
	// plugin binds its socket in place, then listens, must move the clock,
	// or make the socket appear already listening, as the plugin SDK does.
	// Nil means the real clock.
	Clock clock.WithTickerAndDelayedExecution
}

// withDefaults returns a copy of o with zero fields set to their defaults, or
// an error naming the first field that is out of range.
func (o Options) withDefaults() (Options, error) {
	if o.Dir == "" {
		return o, fmt.Errorf("pluginmanager: Options.Dir is required: set it to the registry directory plugins put their sockets in")
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	ints := []struct {
		name string
		v    *int
		def  int
	}{
		{"Workers", &o.Workers, 128},
		{"EventBuffer", &o.EventBuffer, 1024},
		{"EventHistory", &o.EventHistory, 1024},
		{"MaxSockets", &o.MaxSockets, 20000},
	}
	for _, f := range ints {
		if *f.v < 0 {
			return o, fmt.Errorf("pluginmanager: Options.%s is %d: it must be zero (default %d) or positive", f.name, *f.v, f.def)
		}
		if *f.v == 0 {
			*f.v = f.def
		}
	}
	durations := []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{
		{"BackoffInitial", &o.BackoffInitial, 500 * time.Millisecond},
		{"BackoffMax", &o.BackoffMax, 2 * time.Minute},
		{"DialTimeout", &o.DialTimeout, 5 * time.Second},
		{"GetInfoTimeout", &o.GetInfoTimeout, 5 * time.Second},
		{"NotifyTimeout", &o.NotifyTimeout, 5 * time.Second},
		{"HandlerTimeout", &o.HandlerTimeout, 30 * time.Second},
	}
	for _, f := range durations {
		if *f.v < 0 {
			return o, fmt.Errorf("pluginmanager: Options.%s is %s: it must be zero (default %s) or positive", f.name, *f.v, f.def)
		}
		if *f.v == 0 {
			*f.v = f.def
		}
	}
	if o.BackoffMax < o.BackoffInitial {
		return o, fmt.Errorf("pluginmanager: Options.BackoffMax (%s) is less than Options.BackoffInitial (%s)", o.BackoffMax, o.BackoffInitial)
	}
	if o.ResyncInterval == 0 {
		o.ResyncInterval = 30 * time.Second
	}
	if o.AllowedPeers != nil && !peercred.Supported {
		return o, fmt.Errorf("pluginmanager: Options.AllowedPeers cannot be enforced on %s, which does not tell who listens on a unix socket (Linux has SO_PEERCRED, macOS LOCAL_PEERCRED): leave it unset here, and restrict who may write to the registry directory instead", runtime.GOOS)
	}
	for i, root := range o.EndpointRoots {
		if !filepath.IsAbs(root) {
			return o, fmt.Errorf("pluginmanager: Options.EndpointRoots[%d] %q is not an absolute path", i, root)
		}
	}
	if o.ProbeInterval == 0 {
		o.ProbeInterval = DefaultProbeInterval
	}
	if o.Observe {
		o.RemoveStaleAfter = 0 // an observer changes nothing
	}
	if o.UnhealthyGrace == 0 {
		o.UnhealthyGrace = 30 * time.Second
	}
	return o, nil
}
