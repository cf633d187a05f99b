package pluginmanager

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/plugd/plugd/internal/confine"
	"github.com/plugd/plugd/internal/unaryconn"
)

// register runs the handshake with the plugin and its handler, and records
// how it went. The first probe is due a probe interval after the attempt
// started.
func (r *registrar) register(ctx context.Context, path string, e *entry, id fileID, attempt int, fresh bool, started time.Time) result {
	p := Plugin{Socket: path}

	dial := r.client.dial
	if fresh {
		dial = r.client.dialNew
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

	infoCtx, cancel := context.WithTimeoutCause(ctx, r.opts.GetInfoTimeout, r.client.late.getInfo)
	info, err := r.client.getInfo(infoCtx, e, conn, path)
	if !isDialError(err) && errors.Is(err, unaryconn.ErrHangup) && !errors.Is(err, unaryconn.ErrMaybeDelivered) && infoCtx.Err() == nil {
		// The server closed the connection, or sent GOAWAY, before it took
		// the call (a server that limits its connections' age does):
		// asked again at once on a new one, as grpc-go retries such a call.
		conn.Close()
		if conn, err = r.client.dial(infoCtx, e, path); err == nil {
			info, err = r.client.getInfo(infoCtx, e, conn, path)
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
	who := func() peer { return r.client.peerOf(ctx, e, conn, path) }
	if err := r.policy.check(p, who, he); err != nil {
		return r.refuse(ctx, conn, e, p, ReasonPolicy, err, true, attempt)
	}
	if he == nil {
		return r.refuse(ctx, conn, e, p, ReasonNoHandler, fmt.Errorf("%w %q: the manager has none for it", errNoHandler, p.Type), true, attempt)
	}
	h := he.h

	if err := r.sandbox.call(ctx, path, "Validate", func(ctx context.Context) error { return h.Validate(ctx, p) }); err != nil {
		// A refusal is final (but a kubelet handler's); a handler that timed
		// out or panicked may do better next time.
		return r.refuse(ctx, conn, e, p, ReasonValidate, err, !isFault(err) && !isRetryable(err), attempt)
	}

	reg := &registration{id: id, plugin: p, handler: h, endpoint: newEndpointWatch(path, r.queue.Add)}
	if err := r.sandbox.call(reg.endpoint.with(ctx), path, "Register", func(ctx context.Context) error { return h.Register(ctx, p) }); err != nil {
		reg.endpoint.end()
		res := r.refuse(ctx, conn, e, p, ReasonRegister, err, isTerminal(err), attempt)
		if isFault(err) {
			// A handler that timed out may still take the plugin, so that
			// registration is kept, to be taken back if the socket goes or
			// before it is registered again.
			r.reg.lock()
			e.reg = reg
			r.reg.unlock()
		}
		return res
	}

	notifyCtx, cancel := context.WithTimeoutCause(ctx, r.opts.NotifyTimeout, r.client.late.notify)
	conn, told, notifyErr := r.client.notify(notifyCtx, e, conn, path, true, "")
	silent := errors.Is(notifyCtx.Err(), context.DeadlineExceeded) // no answer in time
	cancel()
	if !told && errors.Is(notifyErr, confine.ErrChanged) {
		// Its socket was swapped while it registered (for a symlink, say,
		// which notify did not follow): it was not told, and is gone.
		closeConn(conn)
		return r.gone(ctx, path, e, reg, notifyErr)
	}
	e.live = liveness{probeAt: nextProbe(started, he.probe)}
	r.client.hold(ctx, path, e, conn, r.clock.Now())
	var redial time.Time
	if !r.client.conns.Watching(path) && !e.live.unheld {
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
	r.reg.lock()
	e.reg = reg
	e.accepted = true
	e.answer.Store(nil)
	e.status.Plugin = p
	e.status.State = StateRegistered
	e.status.RegisteredSince = now
	e.status.Reason, e.status.LastError = "", ""
	level := r.reg.recoveredLocked(e, now)
	label := r.table.label(p.Type)
	switch {
	case notifyErr == nil:
	case told && !silent:
		// It answered with an error, or dropped the connection once it
		// had the request: it was told, and is not told again.
		r.reg.say(slog.LevelInfo, "plugin registered; its answer to being told so was an error", "socket", path, "type", p.Type, "name", p.Name, "err", printable(notifyErr.Error()))
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
	r.reg.unlock()
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
		notifyCtx, cancel := context.WithTimeoutCause(ctx, r.opts.NotifyTimeout, r.client.late.notify)
		used, told, nerr := r.client.notify(notifyCtx, e, conn, p.Socket, false, err.Error())
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
	var quiet time.Time
	var fds bool
	if ctx.Err() == nil && reason == ReasonDial && !terminal {
		if at, ok := quietly(e, err, now); ok {
			quiet = at
			r.log.Debug("socket refuses connections a moment after it appeared: bound, not listening yet; trying again", "socket", e.status.Socket, "in", at.Sub(now))
		} else {
			fds = r.client.outOfFDs(err)
		}
	}
	r.reg.lock()
	res, remove := r.failLocked(ctx, e, p, reason, err, terminal, attempt, now, quiet, fds, more)
	r.reg.unlock()
	if remove {
		r.removeStale(e, now)
	}
	return res
}

// failLocked records the failure for fail, and reports whether the socket
// is Stale and old enough to be removed (staleDue).
func (r *registrar) failLocked(ctx context.Context, e *entry, p Plugin, reason Reason, err error, terminal bool, attempt int, now, quiet time.Time, fds bool, more []any) (res result, remove bool) {
	if ctx.Err() != nil {
		// Shutting down: the attempt was cut short, not failed.
		e.status.State = StatePending
		return result{}, false
	}
	e.answer.Store(nil)
	switch {
	case !quiet.IsZero():
		// Bound, not yet listening: not a failure, and not counted.
		e.status.State = StatePending
		e.status.Attempts--
		e.due = quiet
		return result{at: quiet}, false
	case fds:
		// plugd's own want of descriptors, not the plugin's failure:
		// tried again with backoff, neither counted nor Stale.
		e.status.State = StatePending
		e.status.Attempts--
		e.status.NextRetry = now.Add(r.delays.next(&e.backoff))
		e.due = e.status.NextRetry
		return result{at: e.due}, false
	}
	if p.Type == "" {
		// Not answered this time: the socket keeps what it last said, so
		// that a Stale one is still found by its type and name.
		p = e.status.Plugin
	}
	e.status.Plugin = p
	e.status.Reason, e.status.LastError = reason, printable(err.Error())
	r.metrics.failures.WithLabelValues(r.table.label(p.Type), string(reason)).Inc()
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
		return res, false
	}
	stale := reason == ReasonDial && refused(err)
	delay := r.delays.next(&e.backoff)
	e.status.State = StateFailed
	if stale {
		// A socket file nobody listens on: what a crashed plugin leaves.
		e.status.State = StateStale
		remove = r.staleDue(e, now)
	}
	e.status.NextRetry = now.Add(delay)
	e.due = e.status.NextRetry
	r.reg.failedLocked(e, now, "plugin registration failed", append([]any{"socket", p.Socket, "type", p.Type, "name", p.Name, "state", e.status.State, "reason", reason, "err", e.status.LastError, "attempt", attempt, "retryIn", delay}, more...)...)
	return result{at: e.due, err: err, events: []Event{r.reg.eventLocked(EventFailed, e, now)}}, remove
}
