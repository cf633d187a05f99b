package pluginmanager

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/plugd/plugd/internal/backoff"
	"github.com/plugd/plugd/internal/confine"
	"github.com/plugd/plugd/internal/unaryconn"
)

// Liveness, in layers, each as quiet as it can be:
//
//   - The connection a plugin registered over is held open, idle, in the
//     connection set. Its hang-up is the first word that the plugin went:
//     the kernel closes it when the plugin's process dies, and a gRPC server
//     that stops sends GOAWAY. The manager then only connects again, with
//     no call, so nothing shows in the plugin's log: a plugin that still
//     accepts is still there; one that does not is Unhealthy at once.
//   - A handler may watch the plugin's own endpoint (a CSI driver's socket,
//     a DRA or device plugin service) and report it (EndpointReporter): a
//     dead endpoint makes the plugin Unhealthy, reason endpoint, and one
//     that serves keeps a plugin whose registrar died registered.
//   - Routine probes (a GetInfo every ProbeInterval, 5 minutes by default)
//     catch a plugin wedged while its connection stays up.
//
// What each look found is kept in the entry's liveness, read and written
// only by the worker holding the socket's path; the times it waits for (a
// probe, a redial, the end of a grace period) are the queue's, as all times
// are.

// DefaultProbeInterval is the interval of routine probes when
// Options.ProbeInterval is zero: one GetInfo per plugin every 5 minutes, in
// both modes. A plugin that logs every GetInfo (node-driver-registrar does)
// logs 288 lines a day for it, where a 10 s probe made 8,640; the held
// connection's hang-up, not the probe, is what tells at once that a plugin
// went.
const DefaultProbeInterval = 5 * time.Minute

// liveness is what the manager knows of a registered (or observed) plugin's
// liveness beyond its status. A new socket file starts with none.
type liveness struct {
	socketErr   error            // why the registration socket does not answer; nil while it does
	probeFailed bool             // socketErr is a failed probe: only an answer to one clears it
	probeAt     time.Time        // the next probe (routine, or again after a failed one); zero: none
	lastHangup  time.Time        // when it was last hung up
	redialAt    time.Time        // no redial before: after hang-ups in a row, a flood, a failed redial
	backoff     *backoff.Backoff // the delay behind redialAt, made at first need
	flooded     bool             // a flood from this socket file was logged
	kept        bool             // logged: kept registered while its registrar is gone
	quiet       int              // quiet retries of a socket bound and not yet listening
	unremovable bool             // logged: a stale socket that could not be removed
	unheld      bool             // its connection is not held, to keep file descriptors (fds.go): probes watch it
}

// A socket file appears when its server binds it, a moment before the
// server listens on it (node-driver-registrar, and Go's net.Listen, do both
// in place): a connection refused meanwhile is no failure. A socket younger
// than bindGrace that refuses is tried again quietly (no warning, no event,
// no attempt counted), after 20 ms, then twice as long each time, at most
// maxQuiet times; only then is it Stale.
const (
	bindGrace = 2 * time.Second
	maxQuiet  = 7
)

// quietly reports whether an attempt that failed with err at now is retried
// quietly, and when; the caller says so at debug level.
func quietly(e *entry, err error, now time.Time) (time.Time, bool) {
	if !refused(err) || e.live.quiet >= maxQuiet || now.Sub(e.status.Created) >= bindGrace {
		return time.Time{}, false
	}
	d := 20 * time.Millisecond << e.live.quiet
	e.live.quiet++
	return now.Add(d), true
}

// steadyHold is how long a held connection must have lasted for its
// hang-up to be redialled at once; one hung up sooner, or a second hang-up
// within it, waits for the backoff, so that a plugin whose server closes
// every connection at once costs a connection every so often, not a loop.
const steadyHold = 10 * time.Second

// nextProbe is when a routine probe every interval is due after one that
// started at now: in about interval (±10%), start to start, put off to the end of its step of a grid a tenth
// of the interval wide (at most a second). An idle Go process that wakes up
// spends several times a probe's own cost on the wake-up (threads, timers,
// the poller); waking once a step for all the plugins due in it, not once
// per plugin, keeps an idle manager idle. Zero if interval is not positive:
// no probes.
func nextProbe(now time.Time, interval time.Duration) time.Time {
	if interval <= 0 {
		return time.Time{}
	}
	d := time.Duration(float64(interval) * (0.9 + 0.2*rand.Float64()))
	step := min(interval/10, time.Second)
	if step <= 0 {
		return now.Add(d)
	}
	n := now.Add(d).UnixNano()/int64(step) + 1
	return time.Unix(0, n*int64(step))
}

// earliest is the earliest of the times that are not zero, or zero.
func earliest(ts ...time.Time) time.Time {
	var first time.Time
	for _, t := range ts {
		if !t.IsZero() && (first.IsZero() || t.Before(first)) {
			first = t
		}
	}
	return first
}

// samePlugin reports whether a probe's answer is the plugin that registered.
func samePlugin(a, b Plugin) bool {
	return a.Type == b.Type && a.Name == b.Name && a.Endpoint == b.Endpoint && slices.Equal(a.Versions, b.Versions)
}

// heardHangup takes what the connection set said of the connection held
// for path, if it was hung up, and records when the plugin may be
// redialled: at once, unless it is one of several hang-ups in a row, or a
// flood, which is warned of once for the socket file.
func heardHangup(c *client, reg *registry, path string, e *entry, now time.Time) {
	err := c.hangups.take(path)
	if err == nil {
		return
	}
	lv := &e.live
	flood := errors.Is(err, unaryconn.ErrFlood)
	if flood && !lv.flooded {
		lv.flooded = true
		reg.lock()
		reg.warnLocked(e, now, "plugin flooded the idle connection plugd keeps to it; closed it, and backing off before connecting again",
			"socket", path, "type", e.status.Type, "name", e.status.Name, "err", printable(err.Error()))
		reg.unlock()
	} else {
		c.log.Debug("plugin's connection hung up", "socket", path, "err", printable(err.Error()))
	}
	inRow := !lv.lastHangup.IsZero() && now.Sub(lv.lastHangup) < steadyHold
	lv.lastHangup = now
	if !flood && !inRow {
		if lv.backoff != nil {
			lv.backoff.Reset()
		}
		lv.redialAt = now
		return
	}
	lv.redialAt = now.Add(c.redialDelay(lv))
}

// live looks after a registered plugin: it connects again once the
// connection held was hung up, probes when a probe is due, reads what the
// handler said of the endpoint, and from all that decides whether the
// plugin is Registered or Unhealthy, deregistering an Unhealthy one at the
// end of its grace period.
func (r *registrar) live(ctx context.Context, path string, e *entry, reg *registration, he *handlerEntry, now time.Time) result {
	lv := &e.live
	heardHangup(r.client, r.reg, path, e, now)
	switch {
	case !lv.probeAt.IsZero() && !now.Before(lv.probeAt):
		if res, done := r.probe(ctx, path, e, reg, he, now); done {
			return res
		}
	case !r.client.conns.Watching(path) && !lv.unheld && !now.Before(lv.redialAt):
		r.client.redial(ctx, path, e, now)
	}
	if ctx.Err() != nil {
		return result{} // shutting down
	}
	if errors.Is(lv.socketErr, confine.ErrChanged) {
		return r.gone(ctx, path, e, reg, lv.socketErr)
	}
	return r.judge(ctx, path, e, reg, he)
}

// probe asks a registered plugin who it is (its routine probe, or again
// after a failed one). It reports done, with the result, if the answer was
// a different plugin, which is registered afresh; otherwise it only records
// in e.live whether the plugin answered, for judge.
func (r *registrar) probe(ctx context.Context, path string, e *entry, reg *registration, he *handlerEntry, now time.Time) (result, bool) {
	lv := &e.live
	p, conn, err := r.client.ask(ctx, e, path, r.client.conns.Get(path))
	if ctx.Err() != nil {
		closeConn(conn)
		return result{}, true // shutting down
	}
	if err == nil && !samePlugin(p, reg.plugin) {
		closeConn(conn)
		return r.changedPlugin(ctx, path, e, reg, p), true
	}
	if err == nil {
		r.client.hold(ctx, path, e, conn, now)
		lv.socketErr, lv.probeFailed = nil, false
		lv.probeAt = nextProbe(now, he.probe)
		return result{}, false
	}
	r.client.conns.Unwatch(path)
	lv.unheld = false // connected to again with backoff, if there is room
	if isDialError(err) && r.client.outOfFDs(err) {
		lv.probeAt = now.Add(r.client.redialDelay(lv)) // not the plugin's failure
		return result{}, false
	}
	lv.socketErr = err
	lv.probeFailed = !isDialError(err)
	if lv.probeFailed {
		lv.probeAt = now.Add(he.probe) // asked again each interval while it fails, unjittered
	} else {
		lv.probeAt = nextProbe(now, he.probe)
		lv.redialAt = now.Add(r.client.redialDelay(lv))
	}
	return result{}, false
}

// changedPlugin lets go of reg, whose plugin at path answered a probe as
// another plugin, p, so that p is registered afresh. (Apart from probe, so
// that its locals are not on the stack under every probe.)
func (r *registrar) changedPlugin(ctx context.Context, path string, e *entry, reg *registration, p Plugin) result {
	r.log.Info("plugin answers with different info; registering it afresh", "socket", path,
		"was", reg.plugin.Type+"/"+reg.plugin.Name, "now", p.Type+"/"+p.Name)
	r.reg.lock()
	e.reg = nil
	r.reg.unlock()
	err, free := r.deregister(ctx, path, reg)
	now := r.clock.Now()
	r.reg.lock()
	defer r.reg.unlock()
	if !free {
		e.status.State = StatePending // registered again once the abandoned call returns
		r.reg.publishLocked(r.reg.deregisteredLocked(e, reg.plugin, err, now))
		return result{}
	}
	e.status = PluginStatus{Plugin: Plugin{Socket: path}, State: StatePending, Discovered: now, Created: e.status.Created}
	e.earlier = p
	e.backoff = nil
	e.live = liveness{}
	dereg := r.reg.deregisteredLocked(e, reg.plugin, err, now)
	return result{at: now, events: []Event{dereg, r.reg.eventLocked(EventDiscovered, e, now)}}
}

// health is what the last looks found of a registered plugin, for
// judgeHealth.
type health struct {
	state         State         // Registered or Unhealthy
	reason        Reason        // the status's
	lastError     string        // the status's
	since         time.Time     // UnhealthySince
	socketErr     error         // why its registration socket does not answer; nil while it does
	endpointKnown bool          // its handler has reported its endpoint
	endpointErr   error         // its endpoint is down, as its handler reports
	withRegistrar bool          // HandlerOptions.DeregisterWithRegistrar
	noted         bool          // kept registered while its registrar is gone, and said so (liveness.kept)
	grace         time.Duration // negative: for ever
	now           time.Time
}

// judgement is judgeHealth's verdict: the plugin's status from now on, what
// to say of the change, and whether to let it go.
type judgement struct {
	state     State
	reason    Reason
	lastError string
	since     time.Time // UnhealthySince
	why       error     // what makes it Unhealthy; nil if nothing does
	recovered bool      // it was Unhealthy and is not: a Healthy event
	kept      bool      // kept registered while its registrar is gone, newly: one Unhealthy event
	noted     bool      // liveness.kept from now on
	failed    bool      // newly Unhealthy, or for a new reason: an Unhealthy event, a failure
	repeated  bool      // Unhealthy as before: logged at debug level
	graceEnd  time.Time // when an Unhealthy plugin is deregistered; zero while it is not
	letGo     bool      // the grace period is over: deregister it
}

// judgeHealth decides from what the last looks found whether a registered
// plugin is Registered or Unhealthy (and why):
//
//   - an endpoint its handler reports down makes it Unhealthy, reason
//     endpoint;
//   - a registration socket that does not answer (no connection, or a
//     failed probe) makes it Unhealthy, reason unhealthy, unless its handler
//     reports its endpoint serving and its type does not ask for it to be
//     deregistered with its registrar (HandlerOptions.DeregisterWithRegistrar):
//     then it stays Registered, with a note, and one Unhealthy event says so;
//   - an Unhealthy plugin is deregistered at the end of its grace period,
//     unless that is negative (for ever).
func judgeHealth(h health) judgement {
	j := judgement{state: h.state, reason: h.reason, lastError: h.lastError, since: h.since, noted: h.noted}
	var reason Reason
	kept := false
	switch {
	case h.endpointErr != nil:
		j.why, reason = h.endpointErr, ReasonEndpoint
	case h.socketErr != nil && h.endpointKnown && !h.withRegistrar:
		kept = true
	case h.socketErr != nil:
		j.why, reason = h.socketErr, ReasonUnhealthy
	}
	switch {
	case j.why == nil:
		if h.state == StateUnhealthy {
			j.state, j.since, j.reason, j.lastError = StateRegistered, time.Time{}, "", ""
			j.recovered = true
		}
		switch {
		case kept:
			j.reason = ReasonUnhealthy
			j.lastError = printable(fmt.Sprintf("its registration socket does not answer (%v); kept registered while its endpoint serves", h.socketErr))
			j.kept, j.noted = !h.noted, true // said once, with the state it stays in: Registered
		case j.reason == ReasonUnhealthy || j.reason == ReasonEndpoint:
			j.reason, j.lastError, j.noted = "", "", false
		}
	case h.state == StateRegistered || h.reason != reason:
		if h.state == StateRegistered {
			j.state, j.since = StateUnhealthy, h.now
		}
		j.reason, j.lastError, j.failed = reason, printable(j.why.Error()), true
	default:
		j.lastError, j.repeated = printable(j.why.Error()), true
	}
	if j.state == StateUnhealthy && h.grace >= 0 {
		j.graceEnd = j.since.Add(h.grace)
		j.letGo = !h.now.Before(j.graceEnd)
	}
	return j
}

// judge writes judgeHealth's verdict on a registered plugin into its entry,
// once, and says what changed; it deregisters an Unhealthy one at the end
// of its grace period (letGo), and otherwise looks at it again at its next
// probe, redial or the end of its grace period.
func (r *registrar) judge(ctx context.Context, path string, e *entry, reg *registration, he *handlerEntry) result {
	lv := &e.live
	known, down := reg.endpoint.state()
	watched := r.client.watching(path) || lv.unheld // an unheld plugin waits for its probe
	now := r.clock.Now()
	r.reg.lock()
	st := &e.status
	j := judgeHealth(health{state: st.State, reason: st.Reason, lastError: st.LastError, since: st.UnhealthySince,
		socketErr: lv.socketErr, endpointKnown: known, endpointErr: down, withRegistrar: he.deregisterWithRegistrar,
		noted: lv.kept, grace: he.grace, now: now})
	events := r.healthLocked(path, e, reg.plugin, j, now)
	if !j.letGo {
		var redial time.Time
		if !watched {
			redial = lv.redialAt
		}
		e.due = earliest(lv.probeAt, redial, j.graceEnd)
		r.reg.unlock()
		return result{at: e.due, err: j.why, events: events}
	}
	e.reg = nil
	r.reg.unlock()
	return r.letGo(ctx, path, e, reg, he, j, events)
}

// healthLocked writes j into e's status and says what changed: the events
// to publish, the failure counted and logged. r.reg is locked.
func (r *registrar) healthLocked(path string, e *entry, p Plugin, j judgement, now time.Time) []Event {
	st := &e.status
	st.State, st.Reason, st.LastError, st.UnhealthySince = j.state, j.reason, j.lastError, j.since
	e.live.kept = j.noted
	var events []Event
	label := r.table.label(p.Type)
	switch {
	case j.recovered:
		level := r.reg.recoveredLocked(e, now)
		ev := r.reg.eventLocked(EventHealthy, e, now)
		if j.kept {
			ev.Reason, ev.Error = "", "" // the note that follows is the next event's
		}
		events = append(events, ev)
		r.reg.say(level, "plugin answers again", "socket", path, "type", p.Type, "name", p.Name)
	case j.failed:
		r.metrics.failures.WithLabelValues(label, string(j.reason)).Inc()
		events = append(events, r.reg.eventLocked(EventUnhealthy, e, now))
		msg := "plugin stopped answering"
		if j.reason == ReasonEndpoint {
			msg = "plugin's endpoint stopped serving"
		}
		r.reg.failedLocked(e, now, msg, "socket", path, "type", p.Type, "name", p.Name, "reason", j.reason, "err", st.LastError)
	case j.repeated:
		r.reg.repeatedLocked(now, "plugin still unhealthy", "socket", path, "type", p.Type, "name", p.Name, "reason", st.Reason, "err", st.LastError)
	}
	if j.kept {
		r.metrics.failures.WithLabelValues(label, string(ReasonUnhealthy)).Inc()
		events = append(events, r.reg.eventLocked(EventUnhealthy, e, now))
		r.reg.say(slog.LevelInfo, "plugin's registration socket does not answer, but its endpoint serves: it stays registered",
			"socket", path, "type", p.Type, "name", p.Name, "err", printable(e.live.socketErr.Error()))
	}
	return events
}

// letGo deregisters reg, Unhealthy to the end of its grace period (j), and
// tries it again with backoff (and at once if its socket is re-created).
// One let go for its endpoint, with its registrar answering, is tried
// again only once the endpoint serves (awaitEndpoint): a registration now
// would fail for want of it. The events of the judgement, the deregistration
// (carrying the state it leaves: Failed) and the failure are published
// once the retry is scheduled.
func (r *registrar) letGo(ctx context.Context, path string, e *entry, reg *registration, he *handlerEntry, j judgement, events []Event) result {
	err, free := r.deregister(ctx, path, reg)
	now := r.clock.Now()
	p := reg.plugin
	r.reg.lock()
	defer r.reg.unlock()
	if !free {
		e.status.State = StatePending // registered again once the abandoned call returns
		return result{events: append(events, r.reg.deregisteredLocked(e, p, err, now))}
	}
	st := &e.status
	st.Plugin, st.State, st.Reason = p, StateFailed, j.reason
	st.LastError = printable(fmt.Sprintf("deregistered after %s Unhealthy: %v", he.grace, j.why))
	if j.reason == ReasonEndpoint && e.live.socketErr == nil {
		e.awaiting = p.Endpoint
		st.LastError = printable(fmt.Sprintf("deregistered after %s Unhealthy: %v; waiting for its endpoint to serve to register it again", he.grace, j.why))
	}
	st.NextRetry = now.Add(r.delays.next(&e.backoff))
	events = append(events, r.reg.deregisteredLocked(e, p, err, now))
	e.due = st.NextRetry
	return result{at: e.due, err: j.why, events: append(events, r.reg.eventLocked(EventFailed, e, now))}
}

// awaitPoll caps the delay between looks at the endpoint of a plugin
// deregistered for its endpoint (entry.awaiting), or, observing, seen not
// to answer for it: a connect to a unix socket, no call, costs next to
// nothing, and the plugin is registered (looked at) again within it of its
// endpoint's return, however long it was gone.
const awaitPoll = 2 * time.Second

// awaitEndpoint looks whether the endpoint that e waits for takes a
// connection. If it does not, e stays Failed, looked at again with backoff
// (at most awaitPoll), quietly: the plugin's failure was said when it was
// deregistered. If it does, waiting is false, and the registration is tried.
func (r *registrar) awaitEndpoint(ctx context.Context, path string, e *entry, now time.Time) (res result, waiting bool) {
	if err := endpointTakes(ctx, e.awaiting, path, r.policy.resolved, r.opts.DialTimeout); err == nil {
		r.reg.lock()
		e.awaiting = ""
		r.reg.unlock()
		r.log.Debug("plugin's endpoint serves again; registering it again", "socket", path)
		return result{}, false
	}
	if ctx.Err() != nil {
		return result{}, true
	}
	r.reg.lock()
	defer r.reg.unlock()
	e.status.NextRetry = now.Add(min(r.delays.next(&e.backoff), awaitPoll))
	e.due = e.status.NextRetry
	return result{at: e.due}, true
}

// endpointTakes connects to endpoint, the endpoint of the plugin whose
// registration socket is socket, with no call, within timeout, confined as
// its handler's connections are (confine.For: to roots, or for an endpoint
// that is the registration socket, to its directory). It returns nil if the
// endpoint took the connection, else why not.
func endpointTakes(ctx context.Context, endpoint, socket string, roots []string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	conn, err := confine.For(endpoint, socket, roots).Dial(ctx, endpoint)
	if err == nil {
		conn.Close()
	}
	return err
}
