package pluginmanager

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/plugd/plugd/internal/unaryconn"
)

// Liveness: a registered plugin's next probe is a time the queue holds
// (entry.due), on a grid so that the probes due in one step start from one
// wake-up; a probe is a GetInfo with a deadline, on the connection the plugin
// registered over, run by the worker that holds the socket's path.

// nextProbe is when a routine probe every interval is due after one that
// started at now: in about interval (±10%), start to start, put off to the end of its step of a grid a tenth
// of the interval wide (at most a second). An idle Go process that wakes up
// spends several times a probe's own cost on the wake-up (threads, timers,
// the poller); waking once a step for all the plugins due in it, not once
// per plugin, keeps an idle manager idle. Zero if interval is negative:
// no probes.
func nextProbe(now time.Time, interval time.Duration) time.Time {
	if interval < 0 {
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

// samePlugin reports whether a probe's answer is the plugin that registered.
func samePlugin(a, b Plugin) bool {
	return a.Type == b.Type && a.Name == b.Name && a.Endpoint == b.Endpoint && slices.Equal(a.Versions, b.Versions)
}

// probe asks a registered plugin who it is. An answer keeps it (or makes it
// again) Registered, without a word to its handler; no answer makes it
// Unhealthy at once, and deregistered once that has lasted its grace period;
// a different answer is a different plugin, registered afresh.
func (r *registrar) probe(ctx context.Context, path string, e *entry, reg *registration, he *handlerEntry) result {
	started := r.clock.Now()
	p, conn, err := r.ask(ctx, path, r.conns.Take(path))
	if ctx.Err() != nil {
		closeConn(conn)
		return result{} // shutting down
	}
	if err == nil && !samePlugin(p, reg.plugin) {
		closeConn(conn)
		r.log.Info("plugin answers with different info; registering it afresh", "socket", path,
			"was", reg.plugin.Type+"/"+reg.plugin.Name, "now", p.Type+"/"+p.Name)
		r.reg.mu.Lock()
		e.reg = nil
		r.reg.mu.Unlock()
		if !r.deregister(ctx, path, e, reg) {
			return result{}
		}
		now := r.clock.Now()
		r.reg.mu.Lock()
		defer r.reg.mu.Unlock()
		e.status = PluginStatus{Plugin: Plugin{Socket: path}, State: StatePending, Discovered: now, Created: e.status.Created}
		e.backoff = nil
		return result{at: now, events: []Event{r.reg.eventLocked(EventDiscovered, e, now)}}
	}
	if err == nil {
		r.keep(ctx, path, conn, he)
	}

	now := r.clock.Now()
	r.reg.mu.Lock()
	label := r.typeLabel(reg.plugin.Type)
	if err == nil {
		defer r.reg.mu.Unlock()
		var events []Event
		if e.status.State == StateUnhealthy {
			e.status.State = StateRegistered
			e.status.UnhealthySince = time.Time{}
			e.status.Reason, e.status.LastError = "", ""
			events = append(events, r.reg.eventLocked(EventHealthy, e, now))
			r.log.Info("plugin answers again", "socket", path, "type", reg.plugin.Type, "name", reg.plugin.Name)
		}
		e.due = nextProbe(started, he.probe)
		return result{at: e.due, events: events}
	}
	var events []Event
	if e.status.State == StateRegistered {
		e.status.State = StateUnhealthy
		e.status.UnhealthySince = now
		e.status.Reason, e.status.LastError = ReasonUnhealthy, printable(err.Error())
		r.metrics.failures.WithLabelValues(label, string(ReasonUnhealthy)).Inc()
		events = append(events, r.reg.eventLocked(EventUnhealthy, e, now))
		r.log.Warn("plugin stopped answering", "socket", path, "type", reg.plugin.Type, "name", reg.plugin.Name, "err", e.status.LastError)
	} else {
		e.status.LastError = printable(err.Error())
	}
	// Asked again each interval while its grace lasts, and at its end.
	if end := e.status.UnhealthySince.Add(he.grace); now.Before(end) {
		e.due = started.Add(he.probe)
		if end.Before(e.due) {
			e.due = end
		}
		r.reg.mu.Unlock()
		return result{at: e.due, err: err, events: events}
	}
	e.reg = nil
	r.reg.mu.Unlock()
	for _, ev := range events {
		r.reg.events.publish(ev) // before the Deregistered event
	}

	// The grace period is over: let it go. It is tried again at every probe
	// interval (and at once if its socket is re-created).
	if !r.deregister(ctx, path, e, reg) {
		return result{}
	}
	now = r.clock.Now()
	r.reg.mu.Lock()
	defer r.reg.mu.Unlock()
	e.status.Plugin = reg.plugin
	e.status.State = StateFailed
	e.status.Reason, e.status.LastError = ReasonUnhealthy, printable(fmt.Sprintf("deregistered after not answering for %s: %v", he.grace, err))
	e.status.NextRetry = now.Add(max(he.probe, 0))
	e.due = e.status.NextRetry
	return result{at: e.due, err: err, events: []Event{r.reg.eventLocked(EventFailed, e, now)}}
}

// ask asks the plugin at path who it is, with GetInfo's deadline: on conn if
// that is open, else on a new connection, which it returns open with the
// answer. A held connection that turns out closed (a plugin's server may
// close idle connections, or be gone) is not an answer: a new one tells
// which.
func (p *parts) ask(ctx context.Context, path string, conn *unaryconn.Conn) (Plugin, *unaryconn.Conn, error) {
	return p.askNew(ctx, path, conn, false)
}

// askNew is ask, dialling with dialNew if fresh: the socket just appeared.
func (p *parts) askNew(ctx context.Context, path string, conn *unaryconn.Conn, fresh bool) (Plugin, *unaryconn.Conn, error) {
	if conn != nil {
		pl, err := p.askOn(ctx, conn, path)
		if err == nil {
			return pl, conn, nil
		}
		// Only a connection the plugin closed is worth another try; a
		// plugin that answered, even with an error, or that let the
		// deadline pass, has said what it has to say.
		closed := !conn.Usable() && status.Code(err) == codes.Unavailable
		conn.Close()
		if !closed || ctx.Err() != nil {
			return Plugin{}, nil, err
		}
	}
	dial := p.dial
	if fresh {
		dial = p.dialNew
	}
	conn, err := dial(ctx, path)
	if err != nil {
		return Plugin{}, nil, dialFailure{err}
	}
	pl, err := p.askOn(ctx, conn, path)
	if err != nil {
		conn.Close()
		return Plugin{}, nil, err
	}
	return pl, conn, nil
}

// askOn is GetInfo on conn, with its deadline, checked as at registration.
func (p *parts) askOn(ctx context.Context, conn *unaryconn.Conn, path string) (Plugin, error) {
	infoCtx, cancel := context.WithTimeoutCause(ctx, p.opts.GetInfoTimeout,
		fmt.Errorf("no answer within %s", p.opts.GetInfoTimeout))
	defer cancel()
	info, err := getInfo(infoCtx, conn)
	if err != nil {
		return Plugin{}, err
	}
	return pluginFromInfo(info, path)
}

// closeConn closes conn, which may be nil.
func closeConn(conn *unaryconn.Conn) {
	if conn != nil {
		conn.Close()
	}
}

// removeIfStaleLocked removes a Stale socket older than
// Options.RemoveStaleAfter, if set: a crashed plugin's leftover that nobody
// will come back for. Only the very file that was found stale is removed.
func (r *registrar) removeIfStaleLocked(e *entry, now time.Time) {
	if r.opts.RemoveStaleAfter <= 0 || now.Sub(e.status.Created) < r.opts.RemoveStaleAfter {
		return
	}
	if id, ok := statSocket(e.status.Socket); !ok || id != e.id {
		return
	}
	if err := os.Remove(e.status.Socket); err != nil {
		r.log.Warn("could not remove a stale socket", "socket", e.status.Socket, "err", err)
		return
	}
	r.log.Info("removed a stale socket", "socket", e.status.Socket, "age", now.Sub(e.status.Created).Round(time.Second))
}

// keep keeps conn, idle, in the connection set, to tell at once when a
// registered plugin's process goes away (see connset). A nil or unusable
// conn is replaced by a new one, so keep may dial. The set owns conn from
// here; with no liveness for the plugin's type it is closed.
func (r *registrar) keep(ctx context.Context, path string, conn *unaryconn.Conn, he *handlerEntry) {
	if he.probe < 0 {
		closeConn(conn)
		return
	}
	if conn == nil || !conn.Usable() {
		closeConn(conn)
		var err error
		conn, err = r.dial(ctx, path)
		if err != nil {
			r.log.Debug("cannot watch the plugin's connection; relying on probes", "socket", path, "err", err)
			return
		}
		// No call went over it: Idle sends what the handshake still owes.
		if !conn.Idle() {
			conn.Close()
			return
		}
	}
	if err := r.conns.Watch(path, conn); err != nil {
		r.log.Debug("cannot watch the plugin's connection; relying on probes", "socket", path, "err", err)
	}
}
