package pluginmanager

import (
	"context"
	"errors"
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
// backoff. It never notifies a plugin, calls no handler (only observers),
// and never changes a file.
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
}

func (o *onlooker) states() []State {
	return []State{StatePending, StateAnswering, StateNotAnswering, StateStale}
}

func (o *onlooker) start(*sync.WaitGroup) error { return nil }

func (o *onlooker) stop(context.Context) {
	o.client.conns.Close()
	o.sandbox.wait(o.opts.HandlerTimeout)
}

// reconcile forgets what is gone, and looks at a socket when a look is due.
func (o *onlooker) reconcile(ctx context.Context, path string) result {
	if ctx.Err() != nil || o.sandbox.isBusy(path) {
		return result{}
	}
	id, present := statSocket(path)
	now := o.clock.Now()
	o.reg.lock()
	e := o.reg.entries[path]
	if e == nil && !present {
		o.reg.unlock()
		return result{}
	}
	if e != nil && (!present || e.id != id) {
		o.reg.unlock()
		o.unsee(ctx, path, e)
		o.reg.lock()
		if !present {
			o.reg.forgetLocked(path, e, o.clock.Now())
			o.reg.unlock()
			return result{}
		}
	}
	if e == nil || e.id != id {
		if e = o.reg.discoverLocked(path, id, e, now); e == nil {
			o.reg.unlock() // over Options.MaxSockets
			return result{}
		}
	}
	st, reason := e.status.State, e.status.Reason
	fresh := e.status.Attempts == 0 && now.Sub(e.status.Discovered) < time.Second
	o.reg.unlock()

	lv := &e.live
	heardHangup(o.client, o.reg, path, e, now)
	if err := tooLong(path); err != nil {
		if st == StatePending {
			return o.unreachable(path, e, err, now)
		}
		return result{} // said once; never looked at
	}
	epKnown, epDown := e.seen.state()
	switch {
	case st == StatePending:
		if now.Before(e.due) {
			return result{at: e.due}
		}
		return o.look(ctx, path, e, fresh, now)
	case st == StateAnswering && epDown != nil:
		// Its observer says its endpoint went: no call needed to know.
		return o.record(path, e, e.status.Plugin, epDown, true, now)
	case st == StateAnswering && !lv.probeAt.IsZero() && !now.Before(lv.probeAt):
		return o.look(ctx, path, e, false, now)
	case st == StateAnswering && !o.client.conns.Watching(path) && !lv.unheld && !now.Before(lv.redialAt):
		// Hung up: connect again, with no call. One that accepts is
		// still there, as it was.
		conn, err := o.client.dialIdle(ctx, e, path)
		if errors.Is(err, confine.ErrChanged) {
			return o.gone(ctx, path, e, err)
		}
		if err != nil {
			if ctx.Err() != nil {
				return result{}
			}
			return o.record(path, e, e.status.Plugin, dialFailure{err}, false, now)
		}
		o.client.hold(ctx, path, e, conn, now)
		return result{at: o.next(path, e)}
	case st == StateAnswering:
		return result{at: o.next(path, e)}
	case reason == ReasonEndpoint && epKnown && epDown == nil, !now.Before(lv.redialAt):
		// Its endpoint serves again, or a look is due after a failed one.
		return o.look(ctx, path, e, false, now)
	}
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
	return o.record(path, e, p, err, endpoint, started)
}

// record records what a look at a plugin saw: that it answers (err nil),
// or what failed, and publishes an event for it.
func (o *onlooker) record(path string, e *entry, p Plugin, err error, endpoint bool, started time.Time) result {
	lv := &e.live
	if err != nil {
		lv.probeAt = time.Time{}
		lv.redialAt = started.Add(o.client.redialDelay(lv))
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
	if isDialError(err) && o.client.outOfFDs(err) {
		// plugd's own want of descriptors: looked at again with backoff,
		// as it was.
		o.reg.lock()
		defer o.reg.unlock()
		e.status.NextRetry = lv.redialAt
		return result{at: o.next(path, e)}
	}
	o.reg.lock()
	defer o.reg.unlock()
	e.status.Attempts++
	if err == nil {
		e.status.Plugin = p
		e.status.State = StateAnswering
		e.status.Reason, e.status.LastError = "", ""
		e.status.UnhealthySince = time.Time{}
		e.status.NextRetry = time.Time{}
		level := o.reg.recoveredLocked(e, now)
		at := o.next(path, e)
		if was == StateAnswering {
			return result{at: at, events: []Event{o.reg.eventLocked(EventLooked, e, now)}}
		}
		o.reg.say(level, "plugin answers", "socket", path, "type", p.Type, "name", p.Name, "endpoint", p.Endpoint)
		return result{at: at, events: []Event{o.reg.eventLocked(EventAnswering, e, now)}}
	}
	state, reason := StateNotAnswering, ReasonGetInfo
	switch {
	case endpoint:
		e.status.Plugin = p
		reason = ReasonEndpoint
	case errors.Is(err, errInvalidInfo):
		reason = ReasonInvalidInfo
	case refused(err):
		state, reason = StateStale, ReasonDial
	case isDialError(err):
		reason = ReasonDial
	}
	if was == StateAnswering || was == StatePending {
		e.status.UnhealthySince = now
	}
	sameAsBefore := was == state && e.status.Reason == reason
	e.status.State = state
	e.status.Reason, e.status.LastError = reason, printable(err.Error())
	at := o.next(path, e)
	e.status.NextRetry = lv.redialAt // it is looked at again then
	args := []any{"socket", path, "type", e.status.Type, "name", e.status.Name, "state", state, "reason", reason, "err", e.status.LastError}
	if sameAsBefore {
		o.reg.repeatedLocked(now, "plugin still does not answer", args...)
		return result{at: at, err: err, events: []Event{o.reg.eventLocked(EventLooked, e, now)}}
	}
	o.metrics.failures.WithLabelValues(o.table.label(e.status.Type), string(reason)).Inc()
	o.reg.failedLocked(e, now, "plugin does not answer", args...)
	return result{at: at, err: err, events: []Event{o.reg.eventLocked(EventNotAnswering, e, now)}}
}
