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
			err, _ := r.deregister(ctx, h.path, h.reg)
			r.reg.lock()
			if h.e.status.State.registered() {
				h.e.status.State = StatePending // not registered, nor looked at, until the next Run
			}
			r.reg.publishLocked(r.reg.deregisteredLocked(h.e, h.reg.plugin, err, r.clock.Now()))
			r.reg.unlock()
		})
	}
	wg.Wait()
	r.sandbox.wait(r.opts.HandlerTimeout)
}

// step is what one look at a socket path does: the verdict of nextStep.
type step int

const (
	stepDone       step = iota // nothing to do until something changes
	stepTakeBack               // deregister what the handler holds, then look again
	stepForget                 // the socket is gone: forget it
	stepDiscover               // a new socket file: start afresh, then look again
	stepWait                   // not due yet: look again at the entry's due time
	stepLive                   // look after the registered plugin (liveness.go)
	stepAwait                  // see whether the endpoint it waits for serves, then look again
	stepStaleCheck             // Rejected: see whether its socket went stale (stale.go)
	stepRefuse                 // its path is too long to connect to: Rejected at once
	stepRegister               // a registration attempt (register.go)
)

// sighting is what a look at a socket path knows before it acts: the file
// there, the registry's entry for the path, and the time.
type sighting struct {
	present  bool // a socket file is there, to be used (not in an unsafe directory)
	known    bool // the registry has an entry for the path
	sameFile bool // the file there is the entry's (its identity)
	held     bool // a handler holds a registration of the path (entry.reg)
	heldFile bool // of the file there
	state    State
	reason   Reason
	handled  bool // its type has a handler: the type of the registration held, else the status's
	awaiting bool // it waits for its endpoint to serve (entry.awaiting)
	tooLong  bool // its path is too long to connect to
	due, now time.Time
}

// nextStep decides what a look at a socket path does, from what it knows:
// it takes back what is gone or replaced before it registers the successor,
// looks after a registered plugin, retries a failed one whose retry is
// due, and leaves a rejected one alone. The steps that end with "look
// again" change what the next call sees (the registration taken back, the
// entry made, the endpoint found serving), so a look makes few of them.
func nextStep(s sighting) step {
	switch {
	case !s.known && !s.present:
		return stepDone
	case s.held && (!s.present || !s.heldFile || !s.state.registered()):
		// Gone, replaced, or left with the handler by a Register that
		// timed out: taken back before anything else.
		return stepTakeBack
	case !s.present:
		return stepForget
	case !s.known || !s.sameFile:
		return stepDiscover
	}
	switch s.state {
	case StateRegistered, StateUnhealthy:
		if s.held && !s.handled {
			return stepDone
		}
		if s.held {
			return stepLive
		}
		// Let go at shutdown (Options.DeregisterOnShutdown): registered again.
	case StateFailed, StateStale:
		if s.now.Before(s.due) {
			return stepWait
		}
		if s.awaiting {
			return stepAwait
		}
	case StateRejected:
		if s.reason != ReasonNoHandler || !s.handled {
			return stepStaleCheck
		}
		// A handler for its type was added since: tried again.
	case StatePending:
		if s.now.Before(s.due) {
			return stepWait // a quiet retry
		}
	}
	if s.tooLong {
		return stepRefuse
	}
	return stepRegister
}

// sightingOf is what a look at path knows: id and present say what is at
// the path now, e is its entry or nil. r.reg is locked.
func (r *registrar) sightingOf(path string, e *entry, id fileID, present bool, now time.Time) sighting {
	s := sighting{present: present, now: now, tooLong: tooLong(path) != nil}
	if e == nil {
		return s
	}
	typ := e.status.Type
	if e.reg != nil {
		typ = e.reg.plugin.Type
		s.held, s.heldFile = true, e.reg.id == id
	}
	s.known, s.sameFile = true, e.id == id
	s.state, s.reason, s.due = e.status.State, e.status.Reason, e.due
	s.handled = r.table.get(typ) != nil
	s.awaiting = e.awaiting != ""
	return s
}

// reconcile brings one socket path's registration in line with the file
// there now, one step at a time as nextStep decides: the steps that only
// change the entry are made here, under the registry's lock; the others
// leave it to their caller, with the lock free.
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
	r.reg.lock()
	for {
		now := r.clock.Now()
		e := r.reg.entries[path]
		switch nextStep(r.sightingOf(path, e, id, present, now)) {
		case stepDone:
			r.reg.unlock()
			return result{}
		case stepTakeBack:
			if !r.takeBack(ctx, path, e, id, present) {
				r.reg.unlock()
				return result{} // the abandoned call queues the path again
			}
		case stepForget:
			r.reg.forgetLocked(path, e, now)
			r.reg.unlock()
			return result{}
		case stepDiscover:
			if res, ok := r.discover(path, e, id, now); !ok {
				return res
			}
		case stepWait:
			at := e.due
			r.reg.unlock()
			return result{at: at}
		case stepLive:
			reg, he := e.reg, r.table.get(e.reg.plugin.Type)
			r.reg.unlock()
			return r.live(ctx, path, e, reg, he, now)
		case stepAwait:
			r.reg.unlock()
			if res, waiting := r.awaitEndpoint(ctx, path, e, now); waiting {
				return res
			}
			r.reg.lock()
		case stepStaleCheck:
			r.reg.unlock()
			return r.rejected(ctx, path, e, now)
		case stepRefuse:
			// Refused once, with no connection tried: no retry can shorten it.
			f := failure{p: Plugin{Socket: path}, reason: ReasonDial, err: tooLong(path), terminal: true, attempt: e.status.Attempts}
			r.reg.unlock()
			return r.fail(ctx, e, f)
		case stepRegister:
			return r.attempt(ctx, path, e, now)
		}
	}
}

// takeBack deregisters the registration e holds, as nextStep says: its
// socket is gone or replaced (present, id), or a Register that timed out
// left it with the handler. r.reg is locked, and locked again on return;
// the handler is called with it free. The deregistration and what follows
// from it are written together: the Deregistered event of a socket that is
// gone carries no state, and its entry is forgotten (or made afresh) under
// the same lock; one that a timed-out Register left carries the state of
// the failure. It reports false if the handler call was abandoned.
func (r *registrar) takeBack(ctx context.Context, path string, e *entry, id fileID, present bool) bool {
	reg := e.reg
	e.reg = nil
	r.reg.unlock()
	err, free := r.deregister(ctx, path, reg)
	r.reg.lock()
	ev := r.reg.deregisteredLocked(e, reg.plugin, err, r.clock.Now())
	if !present || reg.id != id {
		ev.State = "" // its file is gone: it has no state
	}
	r.reg.publishLocked(ev)
	return free
}

// discover starts afresh for a new socket file at path, in e (nil for a
// path not known yet). r.reg is locked; it reports ok with it still locked,
// or the result of the look, with it free: over Options.MaxSockets, or a
// new socket in a directory made unsafe since the look began.
func (r *registrar) discover(path string, e *entry, id fileID, now time.Time) (res result, ok bool) {
	known := e != nil
	if e = r.reg.discoverLocked(path, id, e, now); e == nil {
		r.reg.unlock() // over Options.MaxSockets
		return result{}, false
	}
	if known || strings.LastIndexByte(path, filepath.Separator) == len(r.opts.Dir) {
		return result{}, true
	}
	// A directory on the way made unsafe after the look checked it found no
	// entry to queue (watcher.queueUnder): checked again now that there is
	// one, with the lock free.
	r.reg.unlock()
	if !subdirsTrusted(r.opts.Dir, path, r.opts.AllowWritableDir) {
		return result{at: now}, false // and let go at the next look
	}
	r.reg.lock()
	return result{}, true
}

// gone lets go of the socket at path, found when connecting to it (err) not
// to be the socket file discovered there any more: a symlink, which is never
// followed, or another file is at the path, or a directory on the way is now
// a symlink. As for a socket removed, its plugin is deregistered (reg, if
// the handler holds it) and the entry forgotten; whatever is at the path now
// is looked at afresh when the watch reports it.
func (r *registrar) gone(ctx context.Context, path string, e *entry, reg *registration, err error) result {
	logGone(ctx, r.log, path, e, err)
	var dereg error
	free := true
	if reg != nil {
		r.reg.lock()
		e.reg = nil
		r.reg.unlock()
		dereg, free = r.deregister(ctx, path, reg)
	}
	r.reg.lock()
	defer r.reg.unlock()
	if reg != nil {
		ev := r.reg.deregisteredLocked(e, reg.plugin, dereg, r.clock.Now())
		ev.State = "" // its file is gone: it has no state
		r.reg.publishLocked(ev)
	}
	if free && r.reg.entries[path] == e {
		r.reg.forgetLocked(path, e, r.clock.Now())
	}
	return result{}
}

// deregister takes reg back from its handler, and the connection kept for
// it, with the registry's lock free; the caller records it
// (registry.deregisteredLocked). err is the handler's failure; free is
// false if the call was abandoned at its deadline: the path is queued again
// when it returns.
func (r *registrar) deregister(ctx context.Context, path string, reg *registration) (err error, free bool) {
	reg.endpoint.end()
	r.client.conns.Unwatch(path)
	err = r.sandbox.call(ctx, path, "Deregister", func(ctx context.Context) error {
		reg.handler.Deregister(ctx, reg.plugin)
		return nil
	})
	return err, !r.sandbox.isBusy(path)
}
