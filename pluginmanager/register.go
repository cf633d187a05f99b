package pluginmanager

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/plugd/plugd/internal/confine"
	"github.com/plugd/plugd/internal/unaryconn"
)

// A registration attempt, in steps: connect to the registration socket, ask
// GetInfo, check the answer and the options' rules, find the type's
// handler, Validate, Register, and tell the plugin. A step that fails comes
// to an outcome (stepOutcomeOf: from the step and its error only), which
// settle carries out: let the socket go, refuse the plugin (telling it),
// or record the failure (fail, whose outcome decideFailure decides from
// the facts). Each function here holds one step, so that a worker's stack
// under the dial and the calls stays small (bench/README.md).

// try is one registration attempt.
type try struct {
	path    string
	e       *entry
	id      fileID // the socket file tried
	n       int    // its number, the status's Attempts
	fresh   bool   // the socket appeared a moment ago: dialled with dialNew
	started time.Time
}

// attempt starts an attempt at the socket e at path: counted, Registering.
// r.reg is locked; attempt lets it go.
func (r *registrar) attempt(ctx context.Context, path string, e *entry, now time.Time) result {
	e.status.State = StateRegistering
	e.status.Attempts++
	e.status.NextRetry = time.Time{}
	e.due = time.Time{}
	e.answer.Store(nil)
	t := try{path: path, e: e, id: e.id, n: e.status.Attempts, started: now}
	t.fresh = t.n == 1 && now.Sub(e.status.Discovered) < time.Second
	r.reg.unlock()

	r.metrics.attempts.Inc()
	return r.register(ctx, &t)
}

// register runs the attempt's steps, and records how it went. The first
// probe is due a probe interval after the attempt started.
func (r *registrar) register(ctx context.Context, t *try) result {
	if v := r.dirVerdict(); v.failed {
		return r.settle(ctx, t, nil, Plugin{Socket: t.path}, v, nil)
	}
	conn, p, v := r.handshake(ctx, t)
	if v.failed {
		return r.settle(ctx, t, conn, p, v, nil)
	}
	he, v := r.admit(ctx, t, conn, p)
	if v.failed {
		return r.settle(ctx, t, conn, p, v, nil)
	}
	reg, v := r.take(ctx, t, p, he)
	if v.failed {
		return r.settle(ctx, t, conn, p, v, reg)
	}
	return r.tell(ctx, t, conn, p, reg, he)
}

// attemptStep is a step of an attempt that can fail.
type attemptStep int

const (
	atDial     attemptStep = iota // connecting to the registration socket
	atGetInfo                     // asking it who it is
	atInfo                        // checking its answer (pluginFromInfo)
	atPolicy                      // the rules of the options (policy.check)
	atHandler                     // finding the handler for its type
	atValidate                    // the handler's Validate
	atRegister                    // the handler's Register
)

// stepOutcome is what a failed step of an attempt comes to.
type stepOutcome struct {
	failed   bool
	reason   Reason
	err      error // what to record
	terminal bool  // Rejected until its socket changes; else retried with backoff
	tell     bool  // the plugin, which answered GetInfo, is told it was not registered
	gone     bool  // the socket is not the file tried any more: let go, as if removed
	keep     bool  // the handler may hold the plugin still: the registration is kept, to be taken back
	endpoint bool  // the handler may have failed for want of the plugin's endpoint: see awaits
}

// stepOutcomeOf is the outcome of step at failing with err. A plugin that
// cannot be reached, or does not answer, is not told (it is not listening
// to anything); one that answered is told, unless its socket changed. What
// retrying cannot fix is terminal: an answer over the size cap or that
// breaks a rule, a plugin that does not serve Registration, a type with no
// handler, the options' rules, a Validate that refused (but a kubelet
// handler's, which the kubelet retries), a Register that said so
// (TerminalError). A handler that timed out or panicked may do better next
// time; a Register that timed out may still take the plugin. A Validate or
// Register that failed, but not for good, may have failed for want of the
// plugin's endpoint (a CSI driver not up yet): the plugin is told only if
// that endpoint takes connections (awaits).
func stepOutcomeOf(at attemptStep, err error) stepOutcome {
	v := stepOutcome{failed: true, err: err, tell: at > atGetInfo}
	switch {
	case at <= atGetInfo && errors.Is(err, confine.ErrChanged):
		return stepOutcome{failed: true, err: err, gone: true}
	case at == atDial:
		v.reason = ReasonDial
	case at == atGetInfo && status.Code(err) == codes.ResourceExhausted:
		// An answer over the size cap is malformed, not unlucky: retrying
		// would only make the plugin send it again.
		v.reason, v.terminal, v.tell = ReasonInvalidInfo, true, true
		v.err = fmt.Errorf("%w: the GetInfo answer is larger than %d bytes: %w", errInvalidInfo, maxInfoBytes, err)
	case at == atGetInfo && isDialError(err):
		// The HTTP/2 handshake, made with GetInfo, failed, or the
		// connection made again for it did: failed to connect.
		v.reason = ReasonDial
	case at == atGetInfo:
		// A plugin that does not serve Registration at all will not start to by retrying.
		v.reason, v.terminal = ReasonGetInfo, unimplemented(err)
	case at == atInfo:
		v.reason, v.terminal = ReasonInvalidInfo, true
	case at == atPolicy:
		v.reason, v.terminal = ReasonPolicy, true
	case at == atHandler:
		v.reason, v.terminal = ReasonNoHandler, true
	case at == atValidate:
		v.reason, v.terminal = ReasonValidate, !isFault(err) && !isRetryable(err)
		v.endpoint = !v.terminal
	case at == atRegister:
		v.reason, v.terminal, v.keep = ReasonRegister, isTerminal(err), isFault(err)
		v.endpoint = !v.terminal
	}
	return v
}

// handshake connects to the plugin and asks it who it is. It returns the
// connection the answer came on, open, and the plugin, or the outcome of
// the step that failed (with the connection, if one is open).
func (r *registrar) handshake(ctx context.Context, t *try) (*unaryconn.Conn, Plugin, stepOutcome) {
	dial := r.client.dial
	if t.fresh {
		dial = r.client.dialNew
	}
	conn, err := dial(ctx, t.e, t.path)
	if err != nil {
		return nil, Plugin{Socket: t.path}, stepOutcomeOf(atDial, replacedDuring(t.path, t.e, err))
	}
	// From here, refuse takes conn, to tell the plugin; a registration keeps
	// it for the liveness watch.
	conn, info, err := r.askInfo(ctx, t, conn)
	if err != nil {
		return conn, Plugin{Socket: t.path}, stepOutcomeOf(atGetInfo, replacedDuring(t.path, t.e, err))
	}
	p, err := pluginFromInfo(info, t.path)
	if err != nil {
		// Keep none of what it said: the error says what was wrong, bounded.
		return conn, Plugin{Socket: t.path}, stepOutcomeOf(atInfo, err)
	}
	return conn, p, stepOutcome{}
}

// askInfo is GetInfo on conn, with its deadline. If the server closed the
// connection, or sent GOAWAY, before it took the call (a server that limits
// its connections' age does), or said that the connection broke the
// protocol (an RST_STREAM or GOAWAY with PROTOCOL_ERROR, say), which a new
// one may not, it is asked again at once on a new one, as grpc-go retries
// such a call: GetInfo changes nothing, so asking twice is harmless. It
// returns the connection the answer came on, or nil if none is open.
func (r *registrar) askInfo(ctx context.Context, t *try, conn *unaryconn.Conn) (*unaryconn.Conn, *registerapi.PluginInfo, error) {
	infoCtx, cancel := context.WithTimeoutCause(ctx, r.opts.GetInfoTimeout, r.client.late.getInfo)
	defer cancel()
	info, err := r.client.getInfo(infoCtx, t.e, conn, t.path)
	if !isDialError(err) && infoCtx.Err() == nil && (errors.Is(err, unaryconn.ErrHangup) && !errors.Is(err, unaryconn.ErrMaybeDelivered) || errors.Is(err, unaryconn.ErrProtocol)) {
		conn.Close()
		if conn, err = r.client.dial(infoCtx, t.e, t.path); err == nil {
			info, err = r.client.getInfo(infoCtx, t.e, conn, t.path)
		} else {
			conn, err = nil, dialFailure{err}
		}
	}
	return conn, info, err
}

// admit applies the options' rules to p, finds its type's handler, and asks
// it whether p may register (Validate).
func (r *registrar) admit(ctx context.Context, t *try, conn *unaryconn.Conn, p Plugin) (*handlerEntry, stepOutcome) {
	t.e.answer.Store(&p)
	he := r.table.get(p.Type)
	who := func() peer { return r.client.peerOf(ctx, t.e, conn, t.path) }
	if err := r.policy.check(p, who, he); err != nil {
		return nil, stepOutcomeOf(atPolicy, err)
	}
	if he == nil {
		return nil, stepOutcomeOf(atHandler, fmt.Errorf("%w %q: the manager has none for it", errNoHandler, p.Type))
	}
	h := he.h
	if err := r.sandbox.call(ctx, t.path, "Validate", func(ctx context.Context) error { return h.Validate(ctx, p) }); err != nil {
		return nil, stepOutcomeOf(atValidate, err)
	}
	return he, stepOutcome{}
}

// take hands p to its handler (Register). On failure it returns the
// registration only if the handler may hold it still (stepOutcome.keep).
func (r *registrar) take(ctx context.Context, t *try, p Plugin, he *handlerEntry) (*registration, stepOutcome) {
	h := he.h
	reg := &registration{id: t.id, plugin: p, handler: h, endpoint: newEndpointWatch(t.path, r.queue.Add)}
	err := r.sandbox.call(reg.endpoint.with(ctx), t.path, "Register", func(ctx context.Context) error { return h.Register(ctx, p) })
	if err == nil {
		return reg, stepOutcome{}
	}
	reg.endpoint.end()
	v := stepOutcomeOf(atRegister, err)
	if !v.keep {
		reg = nil
	}
	return reg, v
}

// settle carries out the outcome v of a failed step: the socket let go,
// the plugin refused (told, over conn), or the failure recorded (a plugin
// that waits for its endpoint is not told: awaits). keep is a registration
// the handler may hold still.
func (r *registrar) settle(ctx context.Context, t *try, conn *unaryconn.Conn, p Plugin, v stepOutcome, keep *registration) result {
	f := failure{p: p, reason: v.reason, err: v.err, terminal: v.terminal, attempt: t.n, keep: keep}
	switch {
	case v.gone:
		closeConn(conn)
		return r.gone(ctx, t.path, t.e, nil, v.err)
	case v.tell && !r.awaits(ctx, t, p, v, &f):
		return r.refuse(ctx, conn, t.e, f)
	}
	closeConn(conn)
	return r.fail(ctx, t.e, f)
}

// mayAwaitEndpoint decides whether the plugin p, whose attempt failed as v
// says, may wait for its endpoint instead of being told it was not
// registered: if its handler's Validate or Register failed, not for good
// (stepOutcome.endpoint), and it announced an endpoint of its own. It waits if
// that endpoint then takes no connection (awaits).
func mayAwaitEndpoint(v stepOutcome, p Plugin) bool {
	return v.endpoint && p.Endpoint != "" && p.Endpoint != p.Socket
}

// awaits reports whether the plugin p, whose attempt t failed as v says,
// waits for its endpoint rather than being told: a registrar told it was
// not registered exits (node-driver-registrar does), and nothing registers
// its plugin again, although the failure may only be that the plugin's own
// endpoint does not serve yet (a CSI driver that starts after its
// registrar, or is down while plugd restarts). If mayAwaitEndpoint says it
// may and the endpoint takes no connection, it writes into f what is
// recorded, Failed, reason endpoint, saying so, and the endpoint to wait
// for (failure.awaiting): the plugin is registered, and told, once its
// endpoint takes connections (awaitEndpoint). Any other failure is told,
// as the kubelet tells it.
func (r *registrar) awaits(ctx context.Context, t *try, p Plugin, v stepOutcome, f *failure) bool {
	if ctx.Err() != nil || !mayAwaitEndpoint(v, p) {
		return false
	}
	err := endpointTakes(ctx, p.Endpoint, t.path, r.policy.resolved, r.opts.DialTimeout)
	if err == nil || ctx.Err() != nil {
		return false
	}
	f.reason, f.awaiting = ReasonEndpoint, p.Endpoint
	f.err = fmt.Errorf("waiting for its endpoint %s to take connections to register it (%v): %w", p.Endpoint, err, v.err)
	return true
}

// tell tells the registered plugin so, holds the connection, and records
// the registration.
func (r *registrar) tell(ctx context.Context, t *try, conn *unaryconn.Conn, p Plugin, reg *registration, he *handlerEntry) result {
	notifyCtx, cancel := context.WithTimeoutCause(ctx, r.opts.NotifyTimeout, r.client.late.notify)
	conn, told, notifyErr := r.client.notify(notifyCtx, t.e, conn, t.path, true, "")
	silent := errors.Is(notifyCtx.Err(), context.DeadlineExceeded) // no answer in time
	cancel()
	if !told && errors.Is(notifyErr, confine.ErrChanged) {
		// Its socket was swapped while it registered (for a symlink, say,
		// which notify did not follow): it was not told, and is gone.
		closeConn(conn)
		return r.gone(ctx, t.path, t.e, reg, notifyErr)
	}
	e := t.e
	e.live = liveness{probeAt: nextProbe(t.started, he.probe)}
	r.client.hold(ctx, t.path, e, conn, r.clock.Now())
	var redial time.Time
	if !r.client.watching(t.path) && !e.live.unheld {
		redial = e.live.redialAt
	}
	return r.registered(ctx, t.path, e, reg, p, t.n, redial, told, silent, notifyErr)
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

// failure is a failed attempt, to record.
type failure struct {
	p        Plugin // what the plugin said; Socket only if it did not answer
	reason   Reason
	err      error
	terminal bool
	attempt  int
	keep     *registration // a registration the handler may hold still, kept to be taken back
	awaiting string        // the endpoint it waits for (awaits); not told
	more     []any         // logged with it
}

// refuse tells the plugin, over conn, that it was not registered, then
// records the failure; a socket file whose plugin was registered before
// (entry.accepted) is not told. conn is closed.
func (r *registrar) refuse(ctx context.Context, conn *unaryconn.Conn, e *entry, f failure) result {
	switch {
	case e.accepted:
		conn.Close()
		r.log.Debug("plugin not told it was not registered: it was told it was, and a registrar exits when told otherwise", "socket", f.p.Socket, "reason", f.reason)
	case ctx.Err() == nil:
		notifyCtx, cancel := context.WithTimeoutCause(ctx, r.opts.NotifyTimeout, r.client.late.notify)
		used, told, nerr := r.client.notify(notifyCtx, e, conn, f.p.Socket, false, f.err.Error())
		switch {
		case nerr == nil:
		case !told:
			// Said with the failure, and as often.
			f.more = append(f.more, "notifyErr", printable(nerr.Error()))
		default:
			// node-driver-registrar exits when told, sometimes before it
			// answers; the DRA helper answers with an error by design.
			r.log.Debug("plugin told it was not registered; its answer was an error, or none", "socket", f.p.Socket, "err", printable(nerr.Error()))
		}
		closeConn(used)
		cancel()
	default:
		conn.Close()
	}
	return r.fail(ctx, e, f)
}

// failKind is how a failed attempt counts.
type failKind int

const (
	failCut      failKind = iota // cut short by shutdown: not a failure
	failQuiet                    // bound, not listening yet: not a failure, tried again soon
	failOurs                     // plugd short of file descriptors: not the plugin's, tried again with backoff
	failRejected                 // terminal: Rejected until its socket changes
	failRetried                  // Failed, or Stale, tried again with backoff
)

// failFacts are what decides how a failed attempt is recorded.
type failFacts struct {
	shutdown   bool
	reason     Reason
	terminal   bool
	awaiting   bool          // it waits for its endpoint (failure.awaiting)
	refused    bool          // nobody listens on the socket
	quiet      time.Time     // a socket bound a moment ago that refuses is tried again then (quietly); zero if not
	outOfFDs   bool          // the dial failed for want of plugd's file descriptors
	handled    bool          // its type has a handler now
	created    time.Time     // its socket file's birth
	staleAfter time.Duration // Options.RemoveStaleAfter
	now        time.Time
	backoff    func() time.Duration // the socket's next retry delay; called only for a retry with backoff
}

// failOutcome is how a failed attempt is recorded.
type failOutcome struct {
	kind        failKind
	state       State
	due         time.Time // the entry's next look; zero: none
	at          time.Time // when the path is looked at again; zero: not until something changes
	delay       time.Duration
	removeStale bool // Stale, and older than Options.RemoveStaleAfter
}

// decideFailure decides how a failed attempt is recorded: Rejected if
// terminal, else Failed (Stale if nobody listens) with a retry after
// backoff, or, waiting for its endpoint, a look at the endpoint after at
// most awaitPoll; not counted at all if it was cut short, or if it was
// only a socket bound a moment ago, or plugd's want of file descriptors.
func decideFailure(f failFacts) failOutcome {
	switch {
	case f.shutdown:
		return failOutcome{kind: failCut, state: StatePending}
	case !f.quiet.IsZero():
		return failOutcome{kind: failQuiet, state: StatePending, due: f.quiet, at: f.quiet}
	case f.outOfFDs:
		d := f.backoff()
		due := f.now.Add(d)
		return failOutcome{kind: failOurs, state: StatePending, due: due, at: due, delay: d}
	case f.terminal:
		out := failOutcome{kind: failRejected, state: StateRejected}
		if f.staleAfter > 0 {
			// A rejected plugin often exits (node-driver-registrar does),
			// leaving its socket: looked at again once it is old enough.
			out.due = later(f.created.Add(f.staleAfter), f.now)
			out.at = out.due
		}
		if f.reason == ReasonNoHandler && f.handled {
			// AddHandler ran while this attempt was refusing the plugin, and
			// saw it Registering, not Rejected: it is up to us to retry.
			out.at = f.now
		}
		return out
	}
	d := f.backoff()
	if f.awaiting {
		d = min(d, awaitPoll)
	}
	out := failOutcome{kind: failRetried, state: StateFailed, due: f.now.Add(d), delay: d}
	out.at = out.due
	if f.reason == ReasonDial && f.refused {
		// A socket file nobody listens on: what a crashed plugin leaves.
		out.state = StateStale
		out.removeStale = f.staleAfter > 0 && f.now.Sub(f.created) >= f.staleAfter
	}
	return out
}

// later is the later of a and b.
func later(a, b time.Time) time.Time {
	if a.Before(b) {
		return b
	}
	return a
}

// fail records a failed attempt as decideFailure decides, writing the
// entry once. It is logged as failedLocked says: a warning when it is not
// the failure last warned of.
func (r *registrar) fail(ctx context.Context, e *entry, f failure) result {
	now := r.clock.Now()
	facts := failFacts{shutdown: ctx.Err() != nil, reason: f.reason, terminal: f.terminal, awaiting: f.awaiting != "", refused: refused(f.err),
		created: e.status.Created, staleAfter: r.opts.RemoveStaleAfter, now: now,
		backoff: func() time.Duration { return r.delays.next(&e.backoff) }}
	if !facts.shutdown && f.reason == ReasonDial && !f.terminal {
		if at, ok := quietly(e, f.err, now); ok {
			facts.quiet = at
			r.log.Debug("socket refuses connections a moment after it appeared: bound, not listening yet; trying again", "socket", e.status.Socket, "in", at.Sub(now))
		} else {
			facts.outOfFDs = r.client.outOfFDs(f.err)
		}
	}
	if f.p.Type != "" {
		facts.handled = r.table.get(f.p.Type) != nil
	}
	r.reg.lock()
	out := decideFailure(facts)
	res := r.failedLocked(e, f, out, now)
	r.reg.unlock()
	if out.removeStale {
		r.removeStale(e, now)
	}
	return res
}

// failedLocked writes the failure f into e as out says. r.reg is locked.
func (r *registrar) failedLocked(e *entry, f failure, out failOutcome, now time.Time) result {
	if f.keep != nil {
		e.reg = f.keep
	}
	e.status.State = out.state
	if out.kind == failCut {
		return result{}
	}
	e.answer.Store(nil)
	e.due = out.due
	if out.kind == failQuiet || out.kind == failOurs {
		e.status.Attempts--
		if out.kind == failOurs {
			e.status.NextRetry = out.due
		}
		return result{at: out.at}
	}
	p := f.p
	if p.Type == "" {
		// Not answered this time: the socket keeps what it last said, so
		// that a Stale one is still found by its type and name.
		p = e.status.Plugin
	}
	e.status.Plugin = p
	e.status.Reason, e.status.LastError = f.reason, printable(f.err.Error())
	e.awaiting = f.awaiting
	r.metrics.failures.WithLabelValues(r.table.label(p.Type), string(f.reason)).Inc()
	if out.kind == failRejected {
		r.reg.failedLocked(e, now, "plugin rejected", append([]any{"socket", p.Socket, "type", p.Type, "name", p.Name, "reason", f.reason, "err", e.status.LastError}, f.more...)...)
		return result{at: out.at, err: f.err, terminal: true, events: []Event{r.reg.eventLocked(EventRejected, e, now)}}
	}
	e.status.NextRetry = out.due
	msg := "plugin registration failed"
	if f.awaiting != "" {
		msg = "plugin waits for its endpoint to take connections, untold; registered once it does"
	}
	r.reg.failedLocked(e, now, msg, append([]any{"socket", p.Socket, "type", p.Type, "name", p.Name, "state", out.state, "reason", f.reason, "err", e.status.LastError, "attempt", f.attempt, "retryIn", out.delay}, f.more...)...)
	return result{at: out.at, err: f.err, events: []Event{r.reg.eventLocked(EventFailed, e, now)}}
}
