package pluginmanager

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/utils/clock"

	"github.com/plugd/plugd/pluginmanager/internal/queue"
)

// registrar is the manager's default way of running: it registers plugins
// with their handlers and tells them so, keeps the connection each
// registered over (conns) to know at once when one goes, probes them, and
// takes back what is gone.
type registrar struct {
	opts         *Options
	log          *slog.Logger
	clock        clock.Clock
	reg          *registry
	table        *handlerTable
	sandbox      *sandbox
	client       *client
	metrics      *metrics
	queue        *queue.Queue
	policy       policy
	delays       delays       // of retries
	dirUntrusted *atomic.Bool // the watcher found the registry directory not safe (watcher.trusted)
}

func (r *registrar) states() []State {
	return []State{StatePending, StateRegistering, StateRegistered, StateFailed, StateRejected, StateStale, StateUnhealthy}
}

func (r *registrar) start(*sync.WaitGroup) error { return nil }

// stop runs after the workers have stopped: the connections kept are
// closed, handler calls are given a bounded time to return, and
// registrations are dropped only if asked to.
func (r *registrar) stop(ctx context.Context) {
	r.client.conns.Close()
	r.sandbox.wait(r.opts.HandlerTimeout)
	if !r.opts.DeregisterOnShutdown {
		return
	}
	// ctx is done; the deregistrations need a live context of their own, and
	// share one deadline, so that shutdown takes one HandlerTimeout at most
	// however many plugins there are.
	ctx, cancel := context.WithTimeoutCause(context.WithoutCancel(ctx), r.opts.HandlerTimeout,
		fmt.Errorf("shutdown: deregistration did not finish within %s", r.opts.HandlerTimeout))
	defer cancel()
	type held struct {
		path string
		e    *entry
		reg  *registration
	}
	var all []held
	r.reg.lock()
	for path, e := range r.reg.entries {
		if e.reg != nil && !r.sandbox.isBusy(path) {
			all = append(all, held{path, e, e.reg})
			e.reg = nil
		}
	}
	r.reg.unlock()
	var wg sync.WaitGroup
	slots := make(chan struct{}, r.opts.Workers)
	for _, h := range all {
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			r.deregister(ctx, h.path, h.e, h.reg)
		})
	}
	wg.Wait()
	r.sandbox.wait(r.opts.HandlerTimeout)
}

// reconcile brings one socket path's registration in line with the file there
// now: it deregisters what is gone or replaced before it registers the
// successor, probes a registered plugin whose probe is due or whose
// connection went, and retries a failed one whose retry is due.
func (r *registrar) reconcile(ctx context.Context, path string) result {
	if ctx.Err() != nil {
		return result{}
	}
	if r.sandbox.isBusy(path) {
		return result{} // the abandoned call queues the path again when it returns
	}
	id, present := statSocket(path)
	if r.dirUntrusted.Load() || present && !subdirsTrusted(r.opts.Dir, path, r.opts.AllowWritableDir) {
		// Not to be used while the directory, or one it is in, is not safe.
		present = false
	}
	now := r.clock.Now()

	r.reg.lock()
	e := r.reg.entries[path]
	if e == nil && !present {
		r.reg.unlock()
		return result{}
	}
	// Take back what is gone or replaced, and what a timed-out Register may
	// have left with the handler before it is registered again.
	if e != nil && e.reg != nil && (!present || e.reg.id != id || !e.status.State.registered()) {
		reg := e.reg
		e.reg = nil
		r.reg.unlock()
		if !r.deregister(ctx, path, e, reg) {
			return result{}
		}
		now = r.clock.Now()
		r.reg.lock()
	}
	if !present {
		r.reg.forgetLocked(path, e, now)
		r.reg.unlock()
		return result{}
	}
	if e == nil || e.id != id {
		known := e != nil
		if e = r.reg.discoverLocked(path, id, e, now); e == nil {
			r.reg.unlock() // over Options.MaxSockets
			return result{}
		}
		if !known && strings.LastIndexByte(path, filepath.Separator) != len(r.opts.Dir) {
			// A directory on the way made unsafe after the check above
			// found no entry to queue (watcher.queueUnder): checked again
			// now that there is one, with the lock free.
			r.reg.unlock()
			if !subdirsTrusted(r.opts.Dir, path, r.opts.AllowWritableDir) {
				return result{at: now} // and let go at the next look
			}
			r.reg.lock()
		}
	}
	switch e.status.State {
	case StateRegistered, StateUnhealthy:
		if e.reg == nil {
			break // let go at shutdown; register it again
		}
		he := r.table.get(e.reg.plugin.Type)
		if he == nil {
			r.reg.unlock()
			return result{}
		}
		reg := e.reg
		r.reg.unlock()
		return r.live(ctx, path, e, reg, he, now)
	case StateFailed, StateStale:
		if now.Before(e.due) {
			r.reg.unlock()
			return result{at: e.due}
		}
		if e.awaiting != "" {
			r.reg.unlock()
			if res, waiting := r.awaitEndpoint(ctx, path, e, now); waiting {
				return res
			}
			r.reg.lock()
		}
	case StateRejected:
		if e.status.Reason != ReasonNoHandler || r.table.get(e.status.Type) == nil {
			r.reg.unlock()
			return r.rejected(ctx, path, e, now)
		}
	case StatePending:
		if now.Before(e.due) {
			r.reg.unlock()
			return result{at: e.due} // a quiet retry
		}
	}
	if err := tooLong(path); err != nil {
		// Refused once, with no connection tried: no retry can shorten it.
		attempt := e.status.Attempts
		r.reg.unlock()
		return r.fail(ctx, e, Plugin{Socket: path}, ReasonDial, err, true, attempt)
	}
	e.status.State = StateRegistering
	e.status.Attempts++
	e.status.NextRetry = time.Time{}
	e.due = time.Time{}
	e.answer.Store(nil)
	attempt := e.status.Attempts
	fid := e.id
	fresh := attempt == 1 && now.Sub(e.status.Discovered) < time.Second
	r.reg.unlock()

	r.metrics.attempts.Inc()
	return r.register(ctx, path, e, fid, attempt, fresh, now)
}

// gone lets go of the socket at path, found when connecting to it (err) not
// to be the socket file discovered there any more: a symlink, which is never
// followed, or another file is at the path, or a directory on the way is now
// a symlink. As for a socket removed, its plugin is deregistered (reg, if
// the handler holds it) and the entry forgotten; whatever is at the path now
// is looked at afresh when the watch reports it.
func (r *registrar) gone(ctx context.Context, path string, e *entry, reg *registration, err error) result {
	logGone(ctx, r.log, path, e, err)
	if reg != nil {
		r.reg.lock()
		e.reg = nil
		r.reg.unlock()
		if !r.deregister(ctx, path, e, reg) {
			return result{}
		}
	}
	r.reg.lock()
	defer r.reg.unlock()
	if r.reg.entries[path] == e {
		r.reg.forgetLocked(path, e, r.clock.Now())
	}
	return result{}
}

// deregister takes reg back from its handler, and the connection kept for
// it. It reports false if the handler call was abandoned at its deadline;
// the path is queued again when it returns.
func (r *registrar) deregister(ctx context.Context, path string, e *entry, reg *registration) bool {
	reg.endpoint.end()
	r.client.conns.Unwatch(path)
	err := r.sandbox.call(ctx, path, "Deregister", func(ctx context.Context) error {
		reg.handler.Deregister(ctx, reg.plugin)
		return nil
	})
	p := reg.plugin
	now := r.clock.Now()
	r.reg.lock()
	defer r.reg.unlock()
	if e.status.State.registered() {
		e.status.State = StatePending
	}
	e.due = time.Time{}
	e.status.RegisteredSince, e.status.UnhealthySince = time.Time{}, time.Time{}
	r.metrics.deregistrations.WithLabelValues(r.table.label(p.Type)).Inc()
	ev := r.reg.eventLocked(EventDeregistered, e, now)
	ev.Plugin = p
	if err != nil {
		ev.Error = printable(err.Error())
		r.reg.warnLocked(e, now, "plugin deregistration failed", "socket", p.Socket, "type", p.Type, "name", p.Name, "err", ev.Error)
	} else {
		r.reg.say(slog.LevelInfo, "plugin deregistered", "socket", p.Socket, "type", p.Type, "name", p.Name)
	}
	r.reg.publishLocked(ev)
	return !r.sandbox.isBusy(path)
}
