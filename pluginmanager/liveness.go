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
	if !r.deregister(ctx, path, e, reg) {
		return result{}
	}
	now := r.clock.Now()
	r.reg.lock()
	defer r.reg.unlock()
	e.status = PluginStatus{Plugin: Plugin{Socket: path}, State: StatePending, Discovered: now, Created: e.status.Created}
	e.backoff = nil
	e.live = liveness{}
	return result{at: now, events: []Event{r.reg.eventLocked(EventDiscovered, e, now)}}
}

// judge decides from what the last looks found whether a registered plugin
// is Registered or Unhealthy (and why), and when to look again:
//
//   - an endpoint its handler reports down makes it Unhealthy, reason
//     endpoint;
//   - a registration socket that does not answer (no connection, or a
//     failed probe) makes it Unhealthy, reason unhealthy, unless its handler
//     reports its endpoint serving and its type does not ask for it to be
//     deregistered with its registrar (HandlerOptions.DeregisterWithRegistrar):
//     then it stays Registered, with a note, and one Unhealthy event says so;
//   - an Unhealthy plugin is deregistered at the end of its grace period,
//     and retried with backoff.
func (r *registrar) judge(ctx context.Context, path string, e *entry, reg *registration, he *handlerEntry) result {
	lv := &e.live
	epKnown, epErr := reg.endpoint.state()
	var why error
	var reason Reason
	kept := false
	switch {
	case epErr != nil:
		why, reason = epErr, ReasonEndpoint
	case lv.socketErr != nil && epKnown && !he.deregisterWithRegistrar:
		kept = true
	case lv.socketErr != nil:
		why, reason = lv.socketErr, ReasonUnhealthy
	}
	watched := r.client.conns.Watching(path) || lv.unheld // an unheld plugin waits for its probe
	now := r.clock.Now()
	label := r.table.label(reg.plugin.Type)
	p := reg.plugin

	r.reg.lock()
	var events []Event
	st := &e.status
	switch {
	case why == nil:
		if st.State == StateUnhealthy {
			st.State = StateRegistered
			st.UnhealthySince = time.Time{}
			st.Reason, st.LastError = "", ""
			level := r.reg.recoveredLocked(e, now)
			events = append(events, r.reg.eventLocked(EventHealthy, e, now))
			r.reg.say(level, "plugin answers again", "socket", path, "type", p.Type, "name", p.Name)
		}
		switch {
		case kept:
			note := printable(fmt.Sprintf("its registration socket does not answer (%v); kept registered while its endpoint serves", lv.socketErr))
			st.Reason, st.LastError = ReasonUnhealthy, note
			if !lv.kept {
				// Said once, with the state it stays in: Registered.
				lv.kept = true
				r.metrics.failures.WithLabelValues(label, string(ReasonUnhealthy)).Inc()
				events = append(events, r.reg.eventLocked(EventUnhealthy, e, now))
				r.reg.say(slog.LevelInfo, "plugin's registration socket does not answer, but its endpoint serves: it stays registered",
					"socket", path, "type", p.Type, "name", p.Name, "err", printable(lv.socketErr.Error()))
			}
		case st.Reason == ReasonUnhealthy || st.Reason == ReasonEndpoint:
			st.Reason, st.LastError = "", ""
			lv.kept = false
		}
	case st.State == StateRegistered || st.Reason != reason:
		if st.State == StateRegistered {
			st.State = StateUnhealthy
			st.UnhealthySince = now
		}
		st.Reason, st.LastError = reason, printable(why.Error())
		r.metrics.failures.WithLabelValues(label, string(reason)).Inc()
		events = append(events, r.reg.eventLocked(EventUnhealthy, e, now))
		msg := "plugin stopped answering"
		if reason == ReasonEndpoint {
			msg = "plugin's endpoint stopped serving"
		}
		r.reg.failedLocked(e, now, msg, "socket", path, "type", p.Type, "name", p.Name, "reason", reason, "err", st.LastError)
	default:
		st.LastError = printable(why.Error())
		r.reg.repeatedLocked(now, "plugin still unhealthy", "socket", path, "type", p.Type, "name", p.Name, "reason", reason, "err", st.LastError)
	}
	var graceEnd time.Time
	if st.State == StateUnhealthy {
		graceEnd = st.UnhealthySince.Add(he.grace)
	}
	if graceEnd.IsZero() || now.Before(graceEnd) {
		var redial time.Time
		if !watched {
			redial = lv.redialAt
		}
		e.due = earliest(lv.probeAt, redial, graceEnd)
		r.reg.unlock()
		return result{at: e.due, err: why, events: events}
	}
	e.reg = nil
	r.reg.unlock()
	for _, ev := range events {
		r.reg.events.publish(ev) // before the Deregistered event
	}

	// The grace period is over: let it go, and try it again with backoff
	// (and at once if its socket is re-created). One let go for its
	// endpoint, with its registrar answering, is tried again only once the
	// endpoint serves: a registration now would fail for want of it.
	if !r.deregister(ctx, path, e, reg) {
		return result{}
	}
	now = r.clock.Now()
	r.reg.lock()
	defer r.reg.unlock()
	e.status.Plugin = p
	e.status.State = StateFailed
	e.status.Reason, e.status.LastError = reason, printable(fmt.Sprintf("deregistered after %s Unhealthy: %v", he.grace, why))
	if reason == ReasonEndpoint && lv.socketErr == nil {
		e.awaiting = p.Endpoint
		e.status.LastError = printable(fmt.Sprintf("deregistered after %s Unhealthy: %v; waiting for its endpoint to serve to register it again", he.grace, why))
	}
	e.status.NextRetry = now.Add(r.delays.next(&e.backoff))
	e.due = e.status.NextRetry
	return result{at: e.due, err: why, events: []Event{r.reg.eventLocked(EventFailed, e, now)}}
}

// awaitPoll caps the delay between looks at the endpoint of a plugin
// deregistered for its endpoint (entry.awaiting): a connect to a unix
// socket, no call, costs next to nothing, and the plugin is registered
// again within it of its endpoint's return, however long it was gone.
const awaitPoll = 2 * time.Second

// awaitEndpoint looks whether the endpoint that e waits for takes a
// connection. If it does not, e stays Failed, looked at again with backoff
// (at most awaitPoll), quietly: the plugin's failure was said when it was
// deregistered. If it does, waiting is false, and the registration is tried.
func (r *registrar) awaitEndpoint(ctx context.Context, path string, e *entry, now time.Time) (res result, waiting bool) {
	dialCtx, cancel := context.WithTimeout(ctx, r.opts.DialTimeout)
	conn, err := confine.For(e.awaiting, path, r.policy.resolved).Dial(dialCtx, e.awaiting)
	cancel()
	if err == nil {
		conn.Close()
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
