package pluginmanager

import (
	"context"
	"errors"
	"sync"
	"syscall"
	"time"
)

// dialFailure marks an error of ask's connection step.
type dialFailure struct{ error }

func (d dialFailure) Unwrap() error { return d.error }

func isDialError(err error) bool {
	var d dialFailure
	return errors.As(err, &d)
}

// onlooker is the manager observing (Options.Observe): beside another
// manager that registers the plugins, it only looks at each, at once and
// then every probe interval, and records what it saw. It never notifies a
// plugin, calls no handler (only observers), keeps no connection between
// looks, and never changes a file.
type onlooker struct {
	*parts
}

func (o *onlooker) states() []State {
	return []State{StatePending, StateAnswering, StateNotAnswering, StateStale}
}

func (o *onlooker) start(*sync.WaitGroup) error { return nil }

func (o *onlooker) stop(context.Context) { o.calls.wait(o.opts.HandlerTimeout) }

// reconcile forgets what is gone, and looks at a socket whose look is due.
func (o *onlooker) reconcile(ctx context.Context, path string) result {
	if ctx.Err() != nil || o.calls.isBusy(path) {
		return result{}
	}
	id, present := statSocket(path)
	now := o.clock.Now()
	o.reg.mu.Lock()
	e := o.reg.entries[path]
	if e == nil && !present {
		o.reg.mu.Unlock()
		return result{}
	}
	if !present {
		// The observer forgets first, so that whoever sees the socket
		// removed sees the observer's record gone too.
		seen := e.status.Plugin
		o.reg.mu.Unlock()
		if obs := o.observer(seen.Type); obs != nil {
			obs.Forget(seen)
		}
		o.reg.mu.Lock()
		o.reg.forgetLocked(path, e, o.clock.Now())
		o.reg.mu.Unlock()
		return result{}
	}
	if e == nil || e.id != id {
		if e = o.reg.discoverLocked(path, id, e, now); e == nil {
			o.reg.mu.Unlock() // over Options.MaxSockets
			return result{}
		}
	}
	// A new socket is looked at at once, then once per interval.
	if e.status.State != StatePending && (e.due.IsZero() || now.Before(e.due)) {
		o.reg.mu.Unlock()
		return result{at: e.due}
	}
	fresh := e.status.Attempts == 0 && now.Sub(e.status.Discovered) < time.Second
	o.reg.mu.Unlock()
	return o.look(ctx, path, e, fresh, now)
}

// observer is the observer for plugins of type typ, or nil.
func (o *onlooker) observer(typ string) Observer {
	if typ == "" {
		return nil
	}
	return o.table.observer(typ)
}

// look asks a plugin who it is, and records what it saw: no notification,
// no handler, nothing written. The next look is a probe interval after this
// one started.
func (o *onlooker) look(ctx context.Context, path string, e *entry, fresh bool, started time.Time) result {
	p, conn, err := o.askNew(ctx, path, nil, fresh)
	closeConn(conn) // looks are far apart: no connection is kept between them
	endpointFailed := false
	if err == nil {
		if obs := o.observer(p.Type); obs != nil {
			err = o.calls.call(ctx, path, "Observe", func(ctx context.Context) error { return obs.Observe(ctx, p) })
			endpointFailed = err != nil
		}
	}
	if ctx.Err() != nil {
		return result{} // shutting down
	}
	now := o.clock.Now()
	o.reg.mu.Lock()
	defer o.reg.mu.Unlock()
	was := e.status.State
	e.status.Attempts++
	e.due = nextProbe(started, o.opts.ProbeInterval)
	if err == nil {
		e.status.Plugin = p
		e.status.State = StateAnswering
		e.status.Reason, e.status.LastError = "", ""
		e.status.UnhealthySince = time.Time{}
		if was == StateAnswering {
			return result{at: e.due, events: []Event{o.reg.eventLocked(EventLooked, e, now)}}
		}
		o.log.Info("plugin answers", "socket", path, "type", p.Type, "name", p.Name, "endpoint", p.Endpoint)
		return result{at: e.due, events: []Event{o.reg.eventLocked(EventAnswering, e, now)}}
	}
	state, reason := StateNotAnswering, ReasonGetInfo
	switch {
	case endpointFailed:
		e.status.Plugin = p
		reason = ReasonEndpoint
	case errors.Is(err, errInvalidInfo):
		reason = ReasonInvalidInfo
	case errors.Is(err, syscall.ECONNREFUSED):
		state, reason = StateStale, ReasonDial
	case isDialError(err):
		reason = ReasonDial
	}
	e.status.State = state
	e.status.Reason, e.status.LastError = reason, printable(err.Error())
	if was == StateAnswering || was == StatePending {
		e.status.UnhealthySince = now
	}
	if was == state {
		return result{at: e.due, err: err, events: []Event{o.reg.eventLocked(EventLooked, e, now)}}
	}
	o.metrics.failures.WithLabelValues(o.typeLabel(e.status.Type), string(reason)).Inc()
	o.log.Warn("plugin does not answer", "socket", path, "type", e.status.Type, "name", e.status.Name, "state", state, "err", e.status.LastError)
	return result{at: e.due, err: err, events: []Event{o.reg.eventLocked(EventNotAnswering, e, now)}}
}
