package pluginmanager

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/plugd/plugd/internal/backoff"
)

// registry is every socket the manager knows, by path, under one lock: what
// is on disk (the file's identity), what its handler holds (the
// registration), and what the manager reports (the status). Events are
// published under the same lock, so that they come in the order of the
// changes they report.
//
// The lock is taken with lock and let go with unlock, and nothing that
// waits on the world is done in between: no system call on a file (a stat,
// a connect, a remove) and no log write, since a slow disk or a slow log
// reader would hold up every worker. A line to log is said (say) under the
// lock and written by unlock once the lock is free. lockrule_test.go checks
// the rule on the source.
//
// A worker holding a path in the queue is the only writer of that path's
// entry, apart from discovery of a new path by a resync; so a registration
// takes the lock twice, once to start the attempt and once to record how it
// went.
type registry struct {
	events  *broker
	metrics *metrics
	labels  *handlerTable // the metrics' type labels (handlerTable.label)
	log     *slog.Logger
	max     int    // Options.MaxSockets
	rescan  func() // asks for a walk of the directory: a place is free again

	mu               sync.Mutex
	said             []slog.Record // lines said under the lock, for unlock to write
	entries          map[string]*entry
	discoveries      uint64    // socket files discovered so far: each entry's seq
	overLimit        bool      // sockets were left untracked: look again when one goes
	lastLimitWarning time.Time // when the limit was last logged
	fails            failureLog
}

// entry is one socket path.
type entry struct {
	id     fileID
	seq    uint64        // when the file was discovered, in discoveries (see markNewest)
	reg    *registration // nil unless the handler holds this socket's plugin
	status PluginStatus
	// backoff is the delay of the next retry, made at the first failure (most
	// sockets never fail); it starts afresh with each new file at the path.
	backoff *backoff.Backoff
	// due is when the next look at the socket is: a retry (Failed, Stale),
	// a probe (Registered, Unhealthy, observed); zero if none is. The queue
	// holds the same time; this one tells a look that is due from a wake-up
	// for some other reason.
	due time.Time
	// live is what the manager knows of the plugin's liveness (see
	// liveness.go); only the worker holding the path touches it.
	live liveness
	// seen is what the observer of the last look says of the plugin's
	// endpoint, when observing; only the worker holding the path touches it.
	seen *endpointWatch
	// answer is what the plugin said in GetInfo during the attempt under
	// way, for Plugins to show while Registering: it is written without the
	// lock, which an attempt takes only to start and to finish, and dropped
	// when the attempt is recorded.
	answer atomic.Pointer[Plugin]
	// said is what the log said of this file's failures (faillog.go).
	said failureSaid
	// accepted: a handler registered the plugin of this socket file. It is
	// never told it is not registered from then on: a registrar exits when
	// told so (node-driver-registrar does), and the kubelet never tells a
	// plugin again once it took it.
	accepted bool
	// earlier is what a plugin at this path said in GetInfo before the
	// status was last started afresh (a new file at the path, a plugin that
	// answered as another): the status's LastAnswer until it has an answer
	// of its own.
	earlier Plugin
	// awaiting is the endpoint of a plugin deregistered because its
	// endpoint stopped serving while its registration socket answered: it
	// is registered again only once the endpoint takes a connection. When
	// observing, of a plugin seen not to answer for its endpoint: it is
	// looked at again as soon as the endpoint takes a connection.
	awaiting string
}

// registration is what was handed to a handler, kept to take it back.
type registration struct {
	id       fileID
	plugin   Plugin
	handler  Handler
	endpoint *endpointWatch // what the handler says of the plugin's endpoint
}

func newRegistry(events *broker, metrics *metrics, labels *handlerTable, log *slog.Logger, max int, rescan func()) *registry {
	return &registry{events: events, metrics: metrics, labels: labels, log: log, max: max, rescan: rescan, entries: make(map[string]*entry)}
}

// lock takes the registry's lock.
func (r *registry) lock() {
	r.mu.Lock()
}

// unlock lets the lock go, then writes the lines said under it, in order.
func (r *registry) unlock() {
	said := r.said
	r.said = nil
	r.mu.Unlock()
	for _, rec := range said {
		_ = r.log.Handler().Handle(context.Background(), rec)
	}
}

// say is a line for the log, said under the lock: unlock writes it. It
// costs nothing unless the logger takes lines of that level.
func (r *registry) say(level slog.Level, msg string, args ...any) {
	if !r.log.Enabled(context.Background(), level) {
		return
	}
	rec := slog.NewRecord(time.Now(), level, msg, 0)
	rec.Add(args...)
	r.said = append(r.said, rec)
}

// discoverLocked starts afresh for a new socket file at path, in e (nil for
// a path not known yet): no attempts, no backoff, no verdict carried over
// from a file that was there before. It returns nil, and tracks nothing, if
// the manager already tracks as many sockets as it may.
func (r *registry) discoverLocked(path string, id fileID, e *entry, now time.Time) *entry {
	if e == nil {
		if len(r.entries) >= r.max {
			r.metrics.overLimit.Inc()
			r.overLimit = true
			if now.Sub(r.lastLimitWarning) > time.Minute {
				r.lastLimitWarning = now
				r.say(slog.LevelError, "too many sockets: new ones are not tracked until some go; raise Options.MaxSockets if this node needs more",
					"limit", r.max, "socket", path)
			}
			return nil
		}
		e = &entry{}
		r.entries[path] = e
	}
	e.earlier = e.lastAnswer()
	e.id = id
	r.discoveries++
	e.seq = r.discoveries
	e.backoff = nil
	e.due = time.Time{}
	e.live = liveness{}
	e.said = failureSaid{}
	e.accepted, e.awaiting = false, ""
	e.answer.Store(nil)
	e.status = PluginStatus{Plugin: Plugin{Socket: path}, State: StatePending, Discovered: now, Created: time.Unix(id.sec, id.nsec)}
	r.publishLocked(r.eventLocked(EventDiscovered, e, now))
	r.say(slog.LevelDebug, "socket discovered", "socket", path)
	return e
}

// lastAnswer is what a plugin at e's path last said in GetInfo, as far as
// the status shows it (an attempt under way may know more).
func (e *entry) lastAnswer() Plugin {
	if e.status.Type != "" {
		return e.status.Plugin
	}
	return e.earlier
}

// forgetLocked drops the entry of a socket that is gone.
func (r *registry) forgetLocked(path string, e *entry, now time.Time) {
	if r.overLimit {
		// A place is free: find the sockets that were left untracked.
		r.overLimit = false
		r.rescan()
	}
	delete(r.entries, path)
	// The event says the state after it, as every event does: forgotten,
	// the socket has none (not the Registered or Failed it was in).
	ev := r.eventLocked(EventRemoved, e, now)
	ev.State, ev.Reason, ev.NextRetry = "", "", time.Time{}
	r.publishLocked(ev)
	r.say(slog.LevelDebug, "socket removed", "socket", path)
}

// deregisteredLocked records that the handler let p, e's plugin, go (err:
// its Deregister failed), and returns the Deregistered event, for the
// caller to publish: of e's status as the caller left it (the state the
// socket is in once let go), with the handler's error, if any, as its
// Error.
func (r *registry) deregisteredLocked(e *entry, p Plugin, err error, now time.Time) Event {
	e.due = time.Time{}
	e.status.RegisteredSince, e.status.UnhealthySince = time.Time{}, time.Time{}
	r.metrics.deregistrations.WithLabelValues(r.labels.label(p.Type)).Inc()
	ev := r.eventLocked(EventDeregistered, e, now)
	ev.Plugin, ev.Error = p, ""
	if err != nil {
		ev.Error = printable(err.Error())
		r.warnLocked(e, now, "plugin deregistration failed", "socket", p.Socket, "type", p.Type, "name", p.Name, "err", ev.Error)
	} else {
		r.say(slog.LevelInfo, "plugin deregistered", "socket", p.Socket, "type", p.Type, "name", p.Name)
	}
	return ev
}

// eventLocked is an event of e's status as it is now.
func (r *registry) eventLocked(typ EventType, e *entry, now time.Time) Event {
	s := e.status
	return Event{
		Time:      now,
		Type:      typ,
		Plugin:    s.Plugin,
		State:     s.State,
		Reason:    s.Reason,
		Error:     s.LastError,
		Attempt:   s.Attempts,
		NextRetry: s.NextRetry,
	}
}

// publishLocked publishes while r.mu is held, so that events are in the order
// of the changes they report.
func (r *registry) publishLocked(ev Event) { r.events.publish(ev) }

// plugins is the snapshot Manager.Plugins returns.
func (r *registry) plugins() []PluginStatus {
	r.lock()
	out := make([]PluginStatus, 0, len(r.entries))
	order := make(map[string]uint64, len(r.entries))
	for path, e := range r.entries {
		s := e.status
		if s.State == StateRegistering && s.Type == "" {
			if p := e.answer.Load(); p != nil {
				s.Plugin = *p
			}
		}
		s.LastAnswer = e.earlier
		if s.Type != "" {
			s.LastAnswer = s.Plugin
		}
		s.Versions = slices.Clone(s.Versions)
		s.LastAnswer.Versions = slices.Clone(s.LastAnswer.Versions)
		out = append(out, s)
		order[path] = e.seq
	}
	r.unlock()
	slices.SortFunc(out, func(a, b PluginStatus) int { return strings.Compare(a.Socket, b.Socket) })
	markNewest(out, order)
	return out
}

// markNewest marks the newest registered socket of each (type, name) in ps:
// the one whose file was made last, and of files made at the same time, the
// one discovered last (order holds each socket's place in the order of
// discovery). Birth times tie more often than one would think: a
// filesystem stamps a new file with a clock that ticks once per scheduler
// tick (1-10 ms) unless someone has just asked for a fine-grained time, so
// an old and a new instance of a plugin started within one tick are born at
// the same nanosecond, and the socket path alone would then pick one.
func markNewest(ps []PluginStatus, order map[string]uint64) {
	type key struct{ typ, name string }
	newest := make(map[key]int)
	for i, s := range ps {
		if s.State != StateRegistered {
			continue
		}
		k := key{s.Type, s.Name}
		// The newest socket, not the latest registration: an old instance
		// registered again after a blip must not look like the new one.
		j, ok := newest[k]
		if !ok || s.Created.After(ps[j].Created) || s.Created.Equal(ps[j].Created) && order[s.Socket] > order[ps[j].Socket] {
			newest[k] = i
		}
	}
	for _, i := range newest {
		ps[i].Newest = true
	}
}

// delays are the retry delays of a socket: initial, doubled for each
// failure since the socket appeared, up to max, with ±20% jitter so that
// plugins that failed together do not retry together (Options.BackoffInitial
// and BackoffMax). Registrations that fail and connections that are hung up
// each back off so.
type delays struct{ initial, max time.Duration }

// next is b's next delay, b made at its first use: most sockets never
// fail, and need none.
func (d delays) next(b **backoff.Backoff) time.Duration {
	if *b == nil {
		nb := backoff.New(d.initial, d.max, 0.2)
		*b = &nb
	}
	return (*b).Next()
}
