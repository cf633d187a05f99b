package pluginmanager

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/plugd/plugd/internal/confine"
	"github.com/plugd/plugd/internal/unaryconn"
	"github.com/plugd/plugd/pluginmanager/internal/queue"
)

// registrar is the manager's default way of running: it registers plugins
// with their handlers and tells them so, keeps the connection each
// registered over (conns) to know at once when one goes, probes them, and
// takes back what is gone.
type registrar struct {
	*parts
	queue *queue.Queue
}

func (r *registrar) states() []State {
	return []State{StatePending, StateRegistering, StateRegistered, StateFailed, StateRejected, StateStale, StateUnhealthy}
}

func (r *registrar) start(*sync.WaitGroup) error { return nil }

// stop runs after the workers have stopped: the connections kept are
// closed, handler calls are given a bounded time to return, and
// registrations are dropped only if asked to.
func (r *registrar) stop(ctx context.Context) {
	r.conns.Close()
	r.calls.wait(r.opts.HandlerTimeout)
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
	r.reg.mu.Lock()
	for path, e := range r.reg.entries {
		if e.reg != nil && !r.calls.isBusy(path) {
			all = append(all, held{path, e, e.reg})
			e.reg = nil
		}
	}
	r.reg.mu.Unlock()
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
	r.calls.wait(r.opts.HandlerTimeout)
}

// reconcile brings one socket path's registration in line with the file there
// now: it deregisters what is gone or replaced before it registers the
// successor, probes a registered plugin whose probe is due or whose
// connection went, and retries a failed one whose retry is due.
func (r *registrar) reconcile(ctx context.Context, path string) result {
	if ctx.Err() != nil {
		return result{}
	}
	if r.calls.isBusy(path) {
		return result{} // the abandoned call queues the path again when it returns
	}
	id, present := statSocket(path)
	if r.dirUntrusted.Load() {
		present = false // not to be used while the directory is not safe
	}
	now := r.clock.Now()

	r.reg.mu.Lock()
	// Under the lock, so that a directory made unsafe after this look finds
	// the entry it makes when the watch queues what is below it.
	if present && !r.subdirsTrusted(path) {
		present = false // nor while the directory it is in is not
	}
	e := r.reg.entries[path]
	if e == nil && !present {
		r.reg.mu.Unlock()
		return result{}
	}
	// Take back what is gone or replaced, and what a timed-out Register may
	// have left with the handler before it is registered again.
	if e != nil && e.reg != nil && (!present || e.reg.id != id || !e.status.State.registered()) {
		reg := e.reg
		e.reg = nil
		r.reg.mu.Unlock()
		if !r.deregister(ctx, path, e, reg) {
			return result{}
		}
		now = r.clock.Now()
		r.reg.mu.Lock()
	}
	if !present {
		r.reg.forgetLocked(path, e, now)
		r.reg.mu.Unlock()
		return result{}
	}
	if e == nil || e.id != id {
		if e = r.reg.discoverLocked(path, id, e, now); e == nil {
			r.reg.mu.Unlock() // over Options.MaxSockets
			return result{}
		}
	}
	switch e.status.State {
	case StateRegistered, StateUnhealthy:
		if e.reg == nil {
			break // let go at shutdown; register it again
		}
		he := r.table.get(e.reg.plugin.Type)
		if he == nil {
			r.reg.mu.Unlock()
			return result{}
		}
		reg := e.reg
		r.reg.mu.Unlock()
		return r.live(ctx, path, e, reg, he, now)
	case StateFailed, StateStale:
		if now.Before(e.due) {
			r.reg.mu.Unlock()
			return result{at: e.due}
		}
		if e.awaiting != "" {
			r.reg.mu.Unlock()
			if res, waiting := r.awaitEndpoint(ctx, path, e, now); waiting {
				return res
			}
			r.reg.mu.Lock()
		}
	case StateRejected:
		if e.status.Reason != ReasonNoHandler || r.table.get(e.status.Type) == nil {
			r.reg.mu.Unlock()
			return r.rejected(ctx, path, e, now)
		}
	case StatePending:
		if now.Before(e.due) {
			r.reg.mu.Unlock()
			return result{at: e.due} // a quiet retry
		}
	}
	if err := tooLong(path); err != nil {
		// Refused once, with no connection tried: no retry can shorten it.
		attempt := e.status.Attempts
		r.reg.mu.Unlock()
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
	r.reg.mu.Unlock()

	r.metrics.attempts.Inc()
	return r.register(ctx, path, e, fid, attempt, fresh, now)
}

// register runs the handshake with the plugin and its handler, and records
// how it went. The first probe is due a probe interval after the attempt
// started.
func (r *registrar) register(ctx context.Context, path string, e *entry, id fileID, attempt int, fresh bool, started time.Time) result {
	p := Plugin{Socket: path}

	dial := r.dial
	if fresh {
		dial = r.dialNew
	}
	conn, err := dial(ctx, e, path)
	if err != nil {
		err = replacedDuring(path, e, err)
	}
	if errors.Is(err, confine.ErrChanged) {
		return r.gone(ctx, path, e, nil, err)
	}
	if err != nil {
		return r.fail(ctx, e, p, ReasonDial, err, false, attempt)
	}
	// From here, refuse takes conn, to tell the plugin; a registration keeps
	// it for the liveness watch.

	infoCtx, cancel := context.WithTimeoutCause(ctx, r.opts.GetInfoTimeout, r.late.getInfo)
	info, err := r.getInfo(infoCtx, e, conn, path)
	if !isDialError(err) && errors.Is(err, unaryconn.ErrHangup) && !errors.Is(err, unaryconn.ErrMaybeDelivered) && infoCtx.Err() == nil {
		// The server closed the connection, or sent GOAWAY, before it took
		// the call (a server that limits its connections' age does):
		// asked again at once on a new one, as grpc-go retries such a call.
		conn.Close()
		if conn, err = r.dial(infoCtx, e, path); err == nil {
			info, err = r.getInfo(infoCtx, e, conn, path)
		} else {
			conn, err = nil, dialFailure{err}
		}
	}
	cancel()
	if err != nil {
		err = replacedDuring(path, e, err)
	}
	if errors.Is(err, confine.ErrChanged) {
		closeConn(conn)
		return r.gone(ctx, path, e, nil, err)
	}
	if status.Code(err) == codes.ResourceExhausted {
		// An answer over the size cap is malformed, not unlucky: retrying
		// would only make the plugin send it again.
		return r.refuse(ctx, conn, e, p, ReasonInvalidInfo, fmt.Errorf("%w: the GetInfo answer is larger than %d bytes: %w", errInvalidInfo, maxInfoBytes, err), true, attempt)
	}
	if isDialError(err) {
		// The HTTP/2 handshake, made with GetInfo, failed, or the
		// connection made again for it did: failed to connect.
		closeConn(conn)
		return r.fail(ctx, e, p, ReasonDial, err, false, attempt)
	}
	if err != nil {
		closeConn(conn)
		// A plugin that does not serve Registration at all will not start to by retrying.
		return r.fail(ctx, e, p, ReasonGetInfo, err, unimplemented(err), attempt)
	}
	if p, err = pluginFromInfo(info, path); err != nil {
		// Keep none of what it said: the error says what was wrong, bounded.
		return r.refuse(ctx, conn, e, Plugin{Socket: path}, ReasonInvalidInfo, err, true, attempt)
	}
	e.answer.Store(&p)

	he := r.table.get(p.Type)
	who := func() peer { return r.peerOf(ctx, e, conn, path) }
	if err := r.checkPolicy(p, who, he); err != nil {
		return r.refuse(ctx, conn, e, p, ReasonPolicy, err, true, attempt)
	}
	if he == nil {
		return r.refuse(ctx, conn, e, p, ReasonNoHandler, fmt.Errorf("%w %q: the manager has none for it", errNoHandler, p.Type), true, attempt)
	}
	h := he.h

	if err := r.calls.call(ctx, path, "Validate", func(ctx context.Context) error { return h.Validate(ctx, p) }); err != nil {
		// A refusal is final (but a kubelet handler's); a handler that timed
		// out or panicked may do better next time.
		return r.refuse(ctx, conn, e, p, ReasonValidate, err, !isFault(err) && !isRetryable(err), attempt)
	}

	reg := &registration{id: id, plugin: p, handler: h, endpoint: newEndpointWatch(path, r.queue.Add)}
	if err := r.calls.call(reg.endpoint.with(ctx), path, "Register", func(ctx context.Context) error { return h.Register(ctx, p) }); err != nil {
		reg.endpoint.end()
		res := r.refuse(ctx, conn, e, p, ReasonRegister, err, isTerminal(err), attempt)
		if isFault(err) {
			// A handler that timed out may still take the plugin, so that
			// registration is kept, to be taken back if the socket goes or
			// before it is registered again.
			r.reg.mu.Lock()
			e.reg = reg
			r.reg.mu.Unlock()
		}
		return res
	}

	notifyCtx, cancel := context.WithTimeoutCause(ctx, r.opts.NotifyTimeout, r.late.notify)
	conn, told, notifyErr := r.notify(notifyCtx, e, conn, path, true, "")
	silent := errors.Is(notifyCtx.Err(), context.DeadlineExceeded) // no answer in time
	cancel()
	if !told && errors.Is(notifyErr, confine.ErrChanged) {
		// Its socket was swapped while it registered (for a symlink, say,
		// which notify did not follow): it was not told, and is gone.
		closeConn(conn)
		return r.gone(ctx, path, e, reg, notifyErr)
	}
	e.live = liveness{probeAt: nextProbe(started, he.probe)}
	r.keep(ctx, path, e, conn, r.clock.Now())
	var redial time.Time
	if !r.conns.Watching(path) && !e.live.unheld {
		redial = e.live.redialAt
	}
	return r.registered(ctx, path, e, reg, p, attempt, redial, told, silent, notifyErr)
}

// registered records that the plugin p at path is registered, as reg,
// and logs it; told, silent and notifyErr say how telling it went. It is a
// function of its own so that its locals are not on the stack under the
// dial and the calls of every registration: a worker's stack stays small.
func (r *registrar) registered(ctx context.Context, path string, e *entry, reg *registration, p Plugin, attempt int, redial time.Time, told, silent bool, notifyErr error) result {
	now := r.clock.Now()
	r.reg.mu.Lock()
	e.reg = reg
	e.accepted = true
	e.answer.Store(nil)
	e.status.Plugin = p
	e.status.State = StateRegistered
	e.status.RegisteredSince = now
	e.status.Reason, e.status.LastError = "", ""
	level := r.reg.recoveredLocked(e, now)
	label := r.typeLabel(p.Type)
	switch {
	case notifyErr == nil:
	case told && !silent:
		// It answered with an error, or dropped the connection once it
		// had the request: it was told, and is not told again.
		r.log.Info("plugin registered; its answer to being told so was an error", "socket", path, "type", p.Type, "name", p.Name, "err", printable(notifyErr.Error()))
	default:
		// Not told, or told and silent since (it is not told again): the
		// handler holds the plugin, and failing the registration now
		// would only make the handler flap.
		e.status.Reason, e.status.LastError = ReasonNotify, printable(notifyErr.Error())
		r.metrics.failures.WithLabelValues(label, string(ReasonNotify)).Inc()
		msg := "plugin registered but could not be told so"
		if told {
			msg = "plugin registered; it did not answer being told so"
		}
		r.reg.warnLocked(e, now, msg, "socket", path, "type", p.Type, "name", p.Name, "err", e.status.LastError)
	}
	took := now.Sub(e.status.Discovered)
	e.due = earliest(e.live.probeAt, redial)
	res := result{at: e.due, events: []Event{r.reg.eventLocked(EventRegistered, e, now)}}
	r.reg.mu.Unlock()
	// Said once the registry is free again: writing the line must not hold
	// up the other workers. As attributes, so that nothing is boxed.
	r.metrics.latency.WithLabelValues(label).Observe(took.Seconds())
	r.log.LogAttrs(ctx, level, "plugin registered", slog.String("socket", path), slog.String("type", p.Type), slog.String("name", p.Name),
		slog.String("endpoint", p.Endpoint), slog.Any("versions", p.Versions), slog.Int("attempt", attempt))
	return res
}

// refuse tells the plugin, over conn, that it was not registered, then
// records the failure; a socket file whose plugin was registered before
// (entry.accepted) is not told. conn is closed.
func (r *registrar) refuse(ctx context.Context, conn *unaryconn.Conn, e *entry, p Plugin, reason Reason, err error, terminal bool, attempt int) result {
	var untold []any
	switch {
	case e.accepted:
		conn.Close()
		r.log.Debug("plugin not told it was not registered: it was told it was, and a registrar exits when told otherwise", "socket", p.Socket, "reason", reason)
	case ctx.Err() == nil:
		notifyCtx, cancel := context.WithTimeoutCause(ctx, r.opts.NotifyTimeout, r.late.notify)
		used, told, nerr := r.notify(notifyCtx, e, conn, p.Socket, false, err.Error())
		switch {
		case nerr == nil:
		case !told:
			// Said with the failure, and as often.
			untold = []any{"notifyErr", printable(nerr.Error())}
		default:
			// node-driver-registrar exits when told, sometimes before it
			// answers; the DRA helper answers with an error by design.
			r.log.Debug("plugin told it was not registered; its answer was an error, or none", "socket", p.Socket, "err", printable(nerr.Error()))
		}
		closeConn(used)
		cancel()
	default:
		conn.Close()
	}
	return r.fail(ctx, e, p, reason, err, terminal, attempt, untold...)
}

// fail records a failed attempt: Rejected if terminal, else Failed (or
// Stale) with a retry after backoff. It is logged as failedLocked says:
// a warning when it is not the failure last warned of; more args are
// logged with it.
func (r *registrar) fail(ctx context.Context, e *entry, p Plugin, reason Reason, err error, terminal bool, attempt int, more ...any) result {
	now := r.clock.Now()
	r.reg.mu.Lock()
	defer r.reg.mu.Unlock()
	if ctx.Err() != nil {
		// Shutting down: the attempt was cut short, not failed.
		e.status.State = StatePending
		return result{}
	}
	e.answer.Store(nil)
	if reason == ReasonDial && !terminal {
		if at, ok := r.quietly(e, err, now); ok {
			// Bound, not yet listening: not a failure, and not counted.
			e.status.State = StatePending
			e.status.Attempts--
			e.due = at
			return result{at: at}
		}
		if r.outOfFDs(err) {
			// plugd's own want of descriptors, not the plugin's failure:
			// tried again with backoff, neither counted nor Stale.
			e.status.State = StatePending
			e.status.Attempts--
			e.status.NextRetry = now.Add(r.nextDelay(&e.backoff))
			e.due = e.status.NextRetry
			return result{at: e.due}
		}
	}
	if p.Type == "" {
		// Not answered this time: the socket keeps what it last said, so
		// that a Stale one is still found by its type and name.
		p = e.status.Plugin
	}
	e.status.Plugin = p
	e.status.Reason, e.status.LastError = reason, printable(err.Error())
	r.metrics.failures.WithLabelValues(r.typeLabel(p.Type), string(reason)).Inc()
	if terminal {
		e.status.State = StateRejected
		r.reg.failedLocked(e, now, "plugin rejected", append([]any{"socket", p.Socket, "type", p.Type, "name", p.Name, "reason", reason, "err", e.status.LastError}, more...)...)
		res := result{err: err, terminal: true, events: []Event{r.reg.eventLocked(EventRejected, e, now)}}
		if r.opts.RemoveStaleAfter > 0 {
			// A rejected plugin often exits (node-driver-registrar does),
			// leaving its socket: looked at again once it is old enough.
			e.due = e.status.Created.Add(r.opts.RemoveStaleAfter)
			if e.due.Before(now) {
				e.due = now
			}
			res.at = e.due
		}
		if reason == ReasonNoHandler && r.table.get(p.Type) != nil {
			// AddHandler ran while this attempt was refusing the plugin, and
			// saw it Registering, not Rejected: it is up to us to retry.
			res.at = now
		}
		return res
	}
	stale := reason == ReasonDial && refused(err)
	delay := r.nextDelay(&e.backoff)
	e.status.State = StateFailed
	if stale {
		// A socket file nobody listens on: what a crashed plugin leaves.
		e.status.State = StateStale
		r.removeIfStaleLocked(e, now)
	}
	e.status.NextRetry = now.Add(delay)
	e.due = e.status.NextRetry
	r.reg.failedLocked(e, now, "plugin registration failed", append([]any{"socket", p.Socket, "type", p.Type, "name", p.Name, "state", e.status.State, "reason", reason, "err", e.status.LastError, "attempt", attempt, "retryIn", delay}, more...)...)
	return result{at: e.due, err: err, events: []Event{r.reg.eventLocked(EventFailed, e, now)}}
}

// rejected looks at a Rejected socket whose stale check is due
// (Options.RemoveStaleAfter): one nobody listens on any more, as a rejected
// node-driver-registrar leaves behind, is removed; one whose plugin still
// listens is looked at again after as long.
func (r *registrar) rejected(ctx context.Context, path string, e *entry, now time.Time) result {
	if r.opts.RemoveStaleAfter <= 0 || e.due.IsZero() || tooLong(path) != nil {
		return result{}
	}
	if now.Before(e.due) {
		return result{at: e.due}
	}
	conn, err := r.dialIdle(ctx, e, path)
	if err == nil {
		conn.Close()
	}
	if ctx.Err() != nil {
		return result{}
	}
	r.reg.mu.Lock()
	defer r.reg.mu.Unlock()
	if err != nil && refused(err) {
		r.removeIfStaleLocked(e, now)
	}
	e.due = now.Add(r.opts.RemoveStaleAfter)
	return result{at: e.due}
}

// gone lets go of the socket at path, found when connecting to it (err) not
// to be the socket file discovered there any more: a symlink, which is never
// followed, or another file is at the path, or a directory on the way is now
// a symlink. As for a socket removed, its plugin is deregistered (reg, if
// the handler holds it) and the entry forgotten; whatever is at the path now
// is looked at afresh when the watch reports it.
func (r *registrar) gone(ctx context.Context, path string, e *entry, reg *registration, err error) result {
	r.logGone(ctx, path, e, err)
	if reg != nil {
		r.reg.mu.Lock()
		e.reg = nil
		r.reg.mu.Unlock()
		if !r.deregister(ctx, path, e, reg) {
			return result{}
		}
	}
	r.reg.mu.Lock()
	defer r.reg.mu.Unlock()
	if r.reg.entries[path] == e {
		r.reg.forgetLocked(path, e, r.clock.Now())
	}
	return result{}
}

// replacedDuring is err, the failure of a connection to the socket e found
// at path, or, if that socket is no longer there, an error that says so: not
// the plugin's failure, and the watch reports whatever is there now. Another
// socket in its place (a plugin restarting in place as the connection was
// made) wraps confine.ErrReplaced; the path removed, or now something other
// than a socket, wraps confine.ErrChanged. An error that says so already is
// kept as it is.
func replacedDuring(path string, e *entry, err error) error {
	if errors.Is(err, confine.ErrChanged) {
		return err
	}
	id, ok := statSocket(path)
	switch {
	case ok && id == e.id:
		return err
	case ok:
		return fmt.Errorf("%w, as plugd connected to it (%v)", confine.ErrReplaced, err)
	}
	if _, lerr := os.Lstat(path); errors.Is(lerr, fs.ErrNotExist) {
		return fmt.Errorf("%w, as plugd connected to it (%v)", errRemoved, err)
	}
	return fmt.Errorf("%w: it is no longer a socket (%v)", confine.ErrChanged, err)
}

// errRemoved is the ErrChanged of a socket removed while plugd connected to
// it: a plugin that stops removes its socket, nothing out of the ordinary.
var errRemoved = fmt.Errorf("%w: the socket was removed", confine.ErrChanged)

// logGone says why a socket is let go when connecting to it: a warning for
// a symlink or a file that is not a socket, which no plugin puts in place of
// its socket; only a debug line for another socket, as a plugin restarting
// in place leaves (the watch reports it, and it is discovered afresh).
func (p *parts) logGone(ctx context.Context, path string, e *entry, err error) {
	level := slog.LevelWarn
	if errors.Is(err, confine.ErrReplaced) || errors.Is(err, errRemoved) {
		level = slog.LevelDebug
	}
	p.log.Log(ctx, level, "the plugin's socket changed while plugd connected to it; not following it, and letting the plugin go",
		"socket", path, "type", e.status.Type, "name", e.status.Name, "err", printable(err.Error()))
}

// deregister takes reg back from its handler, and the connection kept for
// it. It reports false if the handler call was abandoned at its deadline;
// the path is queued again when it returns.
func (r *registrar) deregister(ctx context.Context, path string, e *entry, reg *registration) bool {
	reg.endpoint.end()
	r.conns.Unwatch(path)
	err := r.calls.call(ctx, path, "Deregister", func(ctx context.Context) error {
		reg.handler.Deregister(ctx, reg.plugin)
		return nil
	})
	p := reg.plugin
	now := r.clock.Now()
	r.reg.mu.Lock()
	defer r.reg.mu.Unlock()
	if e.status.State.registered() {
		e.status.State = StatePending
	}
	e.due = time.Time{}
	e.status.RegisteredSince, e.status.UnhealthySince = time.Time{}, time.Time{}
	r.metrics.deregistrations.WithLabelValues(r.typeLabel(p.Type)).Inc()
	ev := r.reg.eventLocked(EventDeregistered, e, now)
	ev.Plugin = p
	if err != nil {
		ev.Error = printable(err.Error())
		r.reg.warnLocked(e, now, "plugin deregistration failed", "socket", p.Socket, "type", p.Type, "name", p.Name, "err", ev.Error)
	} else {
		r.log.Info("plugin deregistered", "socket", p.Socket, "type", p.Type, "name", p.Name)
	}
	r.reg.publishLocked(ev)
	return !r.calls.isBusy(path)
}
