package pluginmanager

import (
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"sync"
	"time"

	"github.com/plugd/plugd/internal/confine"
	"github.com/plugd/plugd/internal/unaryconn"
	"k8s.io/utils/clock"
)

// onlooker is the manager observing (Options.Observe): beside another
// manager that registers the plugins, it only looks at each, and records
// what it saw. It looks at a new socket at once, then holds the connection
// the look went over, idle, as the registrar does: when that is hung up it
// connects again (no call), when the plugin's observer reports its endpoint
// down or back it records that or looks again, and every ProbeInterval it
// looks again. A plugin that does not answer is looked at again with
// backoff; one whose endpoint does not serve is looked at again within
// awaitPoll (2 s) of the endpoint taking a connection, as a registrar
// registers such a plugin again. It never notifies a plugin, calls no
// handler (only observers), and never changes a file.
type onlooker struct {
	opts    *Options
	log     *slog.Logger
	clock   clock.Clock
	reg     *registry
	table   *handlerTable
	sandbox *sandbox
	client  *client
	metrics *metrics
	queue   func(path string)
	roots   []string // Options.EndpointRoots, resolved: where endpoints are dialled (awaitEndpoint)
}

func (o *onlooker) states() []State {
	return []State{StatePending, StateAnswering, StateNotAnswering, StateStale}
}

func (o *onlooker) start(*sync.WaitGroup) error { return nil }

func (o *onlooker) stop(context.Context) {
	o.client.conns.Close()
	o.sandbox.wait(o.opts.HandlerTimeout)
}

// ostep is what a look at an observed socket does: the verdict of
// observeStep.
type ostep int

const (
	oDone        ostep = iota // nothing until something changes
	oUnreachable              // its path is too long to connect to: said once
	oWait                     // not due: look again at the entry's due time
	oLook                     // ask it GetInfo, and its observer to look (look)
	oDown                     // its observer says its endpoint went: recorded with no call
	oRedial                   // its held connection was hung up: connect again, with no call
	oAwait                    // its endpoint went: see whether it takes a connection, then look
	oLater                    // look again when its probe, redial or retry is due
)

// observation is what a look at an observed socket knows before it acts.
type observation struct {
	state         State
	reason        Reason
	tooLong       bool      // its path is too long to connect to
	due           time.Time // the entry's: a quiet retry of a Pending one
	endpointKnown bool      // its observer has reported its endpoint
	endpointDown  bool      // its observer reports its endpoint down
	held          bool      // a connection to it is held, or may not be (fds.go): its probes watch it
	awaiting      bool      // it waits for its endpoint to take a connection (entry.awaiting)
	probeAt       time.Time
	redialAt      time.Time
	now           time.Time
}

// observeStep decides what a look at an observed socket does: a new one is
// looked at at once; one that answers is looked at again when its probe is
// due, recorded down at once when its observer says its endpoint went, and
// connected to again (no call) when its connection is hung up; one that
// does not answer is looked at again when its observer says its endpoint
// is back, or its retry is due, and one whose endpoint went is looked at
// again as soon as that endpoint takes a connection (awaitPoll).
func observeStep(o observation) ostep {
	due := func(t time.Time) bool { return !t.IsZero() && !o.now.Before(t) }
	switch {
	case o.tooLong && o.state == StatePending:
		return oUnreachable
	case o.tooLong:
		return oDone // said once; never looked at
	case o.state == StatePending && o.now.Before(o.due):
		return oWait
	case o.state == StatePending:
		return oLook
	case o.state == StateAnswering && o.endpointDown:
		return oDown
	case o.state == StateAnswering && due(o.probeAt):
		return oLook
	case o.state == StateAnswering && !o.held && !o.now.Before(o.redialAt):
		return oRedial
	case o.state == StateAnswering:
		return oLater
	case o.reason == ReasonEndpoint && o.endpointKnown && !o.endpointDown:
		return oLook // its observer says its endpoint serves again
	case !o.now.Before(o.redialAt) && o.awaiting:
		return oAwait
	case !o.now.Before(o.redialAt):
		return oLook
	}
	return oLater
}

// reconcile brings what it knows of the socket at path in line with the
// file there (sync), then does what observeStep decides.
func (o *onlooker) reconcile(ctx context.Context, path string) result {
	if ctx.Err() != nil || o.sandbox.isBusy(path) {
		return result{}
	}
	e, fresh, now := o.sync(ctx, path)
	if e == nil {
		return result{}
	}
	lv := &e.live
	heardHangup(o.client, o.reg, path, e, now)
	known, down := e.seen.state()
	ob := observation{state: e.status.State, reason: e.status.Reason, tooLong: tooLong(path) != nil, due: e.due,
		endpointKnown: known, endpointDown: down != nil, held: o.client.watching(path) || lv.unheld,
		awaiting: e.awaiting != "", probeAt: lv.probeAt, redialAt: lv.redialAt, now: now}
	switch observeStep(ob) {
	case oUnreachable:
		return o.unreachable(path, e, tooLong(path), now)
	case oWait:
		return result{at: e.due}
	case oLook:
		return o.look(ctx, path, e, fresh && ob.state == StatePending, now)
	case oDown:
		// Its observer says its endpoint went: no call needed to know.
		return o.record(ctx, path, e, e.status.Plugin, down, true, now)
	case oRedial:
		return o.redial(ctx, path, e, now)
	case oAwait:
		return o.awaitEndpoint(ctx, path, e, now)
	case oLater:
		return result{at: o.next(path, e)}
	}
	return result{}
}

// sync brings the entry of path in line with the file there: what was seen
// of a socket gone or replaced is dropped (unsee), a socket gone is
// forgotten, a new one discovered. It returns the entry of the socket
// there now, or nil if there is none (or it is over Options.MaxSockets),
// whether it appeared a moment ago and was not looked at yet, and the time.
func (o *onlooker) sync(ctx context.Context, path string) (e *entry, fresh bool, now time.Time) {
	id, present := statSocket(path)
	now = o.clock.Now()
	o.reg.lock()
	defer o.reg.unlock()
	e = o.reg.entries[path]
	if e != nil && (!present || e.id != id) {
		o.reg.unlock()
		o.unsee(ctx, path, e)
		o.reg.lock()
		if !present {
			o.reg.forgetLocked(path, e, o.clock.Now())
			return nil, false, now
		}
	}
	if !present {
		return nil, false, now
	}
	if e == nil || e.id != id {
		if e = o.reg.discoverLocked(path, id, e, now); e == nil {
			return nil, false, now // over Options.MaxSockets
		}
	}
	return e, e.status.Attempts == 0 && now.Sub(e.status.Discovered) < time.Second, now
}

// redial connects again, with no call, to a plugin whose held connection
// was hung up: one that accepts is still there, as it was.
func (o *onlooker) redial(ctx context.Context, path string, e *entry, now time.Time) result {
	conn, err := o.client.dialIdle(ctx, e, path)
	if errors.Is(err, confine.ErrChanged) {
		return o.gone(ctx, path, e, err)
	}
	if err != nil {
		if ctx.Err() != nil {
			return result{}
		}
		return o.record(ctx, path, e, e.status.Plugin, dialFailure{err}, false, now)
	}
	o.client.hold(ctx, path, e, conn, now)
	return result{at: o.next(path, e)}
}

// awaitEndpoint sees whether the endpoint that e waits for takes a
// connection (no call), as the registrar's awaitEndpoint does: if it does,
// the plugin is looked at at once; if not, it is seen to again with backoff,
// at most awaitPoll, quietly (its failure was said when it was recorded).
func (o *onlooker) awaitEndpoint(ctx context.Context, path string, e *entry, now time.Time) result {
	gone := endpointGone(ctx, e.awaiting, path, o.roots, o.opts.DialTimeout)
	switch {
	case ctx.Err() != nil:
		return result{}
	case !gone:
		return o.look(ctx, path, e, false, now)
	}
	lv := &e.live
	lv.redialAt = now.Add(min(o.client.redialDelay(lv), awaitPoll))
	o.reg.lock()
	defer o.reg.unlock()
	e.status.NextRetry = lv.redialAt
	return result{at: o.next(path, e)}
}

// unsee drops what was seen of the plugin at path: the observer forgets it
// first, so that whoever sees the socket removed sees the observer's record
// gone too. Forget is called as every handler method is, in the sandbox: a
// panic is recovered, and one that outlives HandlerTimeout is left to
// finish alone (the path waits for it) rather than holding up the worker.
func (o *onlooker) unsee(ctx context.Context, path string, e *entry) {
	o.reg.lock()
	seen := e.status.Plugin
	e.seen.end()
	e.seen = nil
	o.reg.unlock()
	o.client.conns.Unwatch(path)
	obs := o.observer(seen.Type)
	if obs == nil || seen.Type == "" {
		return
	}
	err := o.sandbox.call(context.WithoutCancel(ctx), path, "Forget", func(context.Context) error {
		obs.Forget(seen)
		return nil
	})
	if err != nil {
		o.log.Warn("observer's Forget failed", "socket", path, "type", seen.Type, "name", seen.Name, "err", printable(err.Error()))
	}
}

// gone forgets the socket at path, found when connecting to it (err) not to
// be the socket file discovered there any more (see registrar.gone), as if
// it were removed.
func (o *onlooker) gone(ctx context.Context, path string, e *entry, err error) result {
	logGone(ctx, o.log, path, e, err)
	o.unsee(ctx, path, e)
	o.reg.lock()
	defer o.reg.unlock()
	if o.reg.entries[path] == e {
		o.reg.forgetLocked(path, e, o.clock.Now())
	}
	return result{}
}

// unreachable records, once, a socket that cannot be connected to at all
// (its path is too long, err says): NotAnswering, reason dial, and never
// looked at again, since no retry can change that.
func (o *onlooker) unreachable(path string, e *entry, err error, now time.Time) result {
	o.reg.lock()
	defer o.reg.unlock()
	e.status.State = StateNotAnswering
	e.status.Reason, e.status.LastError = ReasonDial, printable(err.Error())
	e.status.UnhealthySince = now
	e.due = time.Time{}
	o.metrics.failures.WithLabelValues(o.table.label(""), string(ReasonDial)).Inc()
	o.reg.failedLocked(e, now, "plugin cannot be looked at", "socket", path, "state", StateNotAnswering, "reason", ReasonDial, "err", e.status.LastError)
	return result{err: err, terminal: true, events: []Event{o.reg.eventLocked(EventNotAnswering, e, now)}}
}

// next is when an observed plugin is looked at again: its next routine
// look while it answers, the redial of a connection that was hung up, the
// retry of a look that failed.
func (o *onlooker) next(path string, e *entry) time.Time {
	lv := &e.live
	if e.status.State == StateAnswering && (o.client.conns.Watching(path) || lv.unheld) {
		e.due = lv.probeAt
	} else {
		e.due = earliest(lv.probeAt, lv.redialAt)
	}
	return e.due
}

// probeInterval is how often plugins of type typ are looked at again: the
// HandlerOptions of a handler added for it (not called when observing),
// else the Options'.
func (o *onlooker) probeInterval(typ string) time.Duration {
	if he := o.table.get(typ); he != nil {
		return he.probe
	}
	return o.opts.ProbeInterval
}

// observer is the observer for plugins of type typ, or nil.
func (o *onlooker) observer(typ string) Observer {
	if typ == "" {
		return nil
	}
	return o.table.observer(typ)
}

// look asks a plugin who it is, and its observer to look at its endpoint,
// and records what it saw: no notification, no handler, nothing written.
// The connection it asked on is held.
func (o *onlooker) look(ctx context.Context, path string, e *entry, fresh bool, started time.Time) result {
	seen := newEndpointWatch(path, o.queue)
	e.seen.end() // what the last look's observer says no longer counts
	e.seen = seen
	var held *unaryconn.Conn
	if o.client.conns.Watching(path) {
		held = o.client.conns.Get(path)
	}
	p, conn, err := o.client.askNew(ctx, e, path, held, fresh)
	if err == nil {
		o.client.hold(ctx, path, e, conn, started)
	} else {
		o.client.conns.Unwatch(path)
		e.live.unheld = false
	}
	if errors.Is(err, confine.ErrChanged) {
		return o.gone(ctx, path, e, err)
	}
	endpoint := false
	if err == nil {
		if obs := o.observer(p.Type); obs != nil {
			err = o.sandbox.call(seen.with(ctx), path, "Observe", func(ctx context.Context) error { return obs.Observe(ctx, p) })
			endpoint = err != nil
		}
	}
	if ctx.Err() != nil {
		return result{} // shutting down
	}
	lv := &e.live
	if err == nil {
		lv.probeAt = nextProbe(started, o.probeInterval(p.Type))
		if lv.backoff != nil {
			lv.backoff.Reset()
		}
	}
	return o.record(ctx, path, e, p, err, endpoint, started)
}

// lookVerdict is how a look at an observed plugin that was in state was,
// for reason wasReason, is recorded: the state and reason it saw (err nil:
// it answers; endpoint: its observer says its endpoint does not serve),
// and the event. news says whether that is a change, to be logged (and, for
// a failure, counted); a look that saw what the last one saw is Looked.
func lookVerdict(was State, wasReason Reason, err error, endpoint bool) (state State, reason Reason, ev EventType, news bool) {
	if err == nil {
		if was == StateAnswering {
			return StateAnswering, "", EventLooked, false
		}
		return StateAnswering, "", EventAnswering, true
	}
	state, reason = StateNotAnswering, ReasonGetInfo
	switch {
	case endpoint:
		reason = ReasonEndpoint
	case errors.Is(err, errInvalidInfo):
		reason = ReasonInvalidInfo
	case refused(err):
		state, reason = StateStale, ReasonDial
	case isDialError(err):
		reason = ReasonDial
	}
	if was == state && wasReason == reason {
		return state, reason, EventLooked, false
	}
	return state, reason, EventNotAnswering, true
}

// record records what a look at a plugin saw (lookVerdict): that it answers
// (err nil), or what failed, and publishes an event for it. One whose
// endpoint does not take a connection waits for it (awaitEndpoint), seen to
// every awaitPoll at most; one whose endpoint takes connections but whose
// service fails is looked at again with backoff, as any failure is.
func (o *onlooker) record(ctx context.Context, path string, e *entry, p Plugin, err error, endpoint bool, started time.Time) result {
	lv := &e.live
	awaiting := ""
	if err != nil {
		lv.probeAt = time.Time{}
		d := o.client.redialDelay(lv)
		if endpoint && endpointGone(ctx, p.Endpoint, path, o.roots, o.opts.DialTimeout) {
			awaiting, d = p.Endpoint, min(d, awaitPoll)
		}
		lv.redialAt = started.Add(d)
	}
	now := o.clock.Now()
	was := e.status.State // written only by this worker
	if was == StatePending && isDialError(err) {
		if at, ok := quietly(e, err, now); ok {
			o.log.Debug("socket refuses connections a moment after it appeared: bound, not listening yet; trying again", "socket", path, "in", at.Sub(now))
			o.reg.lock()
			e.due = at // bound, not yet listening: no look counted
			o.reg.unlock()
			return result{at: at}
		}
	}
	outOfFDs := isDialError(err) && o.client.outOfFDs(err)
	o.reg.lock()
	defer o.reg.unlock()
	st := &e.status
	if outOfFDs {
		// plugd's own want of descriptors: looked at again with backoff,
		// as it was.
		st.NextRetry = lv.redialAt
		return result{at: o.next(path, e)}
	}
	state, reason, ev, news := lookVerdict(was, st.Reason, err, endpoint)
	st.Attempts++
	if err == nil || endpoint {
		st.Plugin = p
	}
	e.awaiting = ""
	if err == nil {
		st.State, st.Reason, st.LastError = state, "", ""
		st.UnhealthySince, st.NextRetry = time.Time{}, time.Time{}
		level := o.reg.recoveredLocked(e, now)
		if news {
			o.reg.say(level, "plugin answers", "socket", path, "type", p.Type, "name", p.Name, "endpoint", p.Endpoint)
		}
		return result{at: o.next(path, e), events: []Event{o.reg.eventLocked(ev, e, now)}}
	}
	e.awaiting = awaiting
	if was == StateAnswering || was == StatePending {
		st.UnhealthySince = now
	}
	st.State, st.Reason, st.LastError = state, reason, printable(err.Error())
	at := o.next(path, e)
	st.NextRetry = lv.redialAt // it is looked at again then
	args := []any{"socket", path, "type", st.Type, "name", st.Name, "state", state, "reason", reason, "err", st.LastError}
	if !news {
		o.reg.repeatedLocked(now, "plugin still does not answer", args...)
	} else {
		o.metrics.failures.WithLabelValues(o.table.label(st.Type), string(reason)).Inc()
		o.reg.failedLocked(e, now, "plugin does not answer", args...)
	}
	return result{at: at, err: err, events: []Event{o.reg.eventLocked(ev, e, now)}}
}

// endpointGone reports whether the plugin's endpoint is gone: nobody
// listens on it, or its socket file is not there (endpointTakes). An
// endpoint that takes a connection, or one the dial cannot tell of (outside
// Options.EndpointRoots, say), is not.
func endpointGone(ctx context.Context, endpoint, socket string, roots []string, timeout time.Duration) bool {
	err := endpointTakes(ctx, endpoint, socket, roots, timeout)
	return err != nil && (refused(err) || errors.Is(err, fs.ErrNotExist))
}
