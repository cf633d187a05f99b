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

// Liveness: every registered plugin has its next probe scheduled (batched
// with the others due in the same step), so an idle manager does no work per
// tick for all plugins; a probe is a GetInfo with a deadline, on the
// connection the plugin registered over, run by the worker that holds the
// socket's path.

// scheduleProbeLocked arms e's next probe in about d (±10%). A routine probe
// (batch) is put off to the end of its step of a grid a tenth of the probe
// interval wide (at most a second), and the probes due in one step start
// together, from one timer. An idle Go process that wakes up spends several
// times a probe's own cost on the wake-up (threads, timers, the poller); once
// a step for all the plugins due in it, not once per plugin, keeps an idle
// manager idle. m.mu must be held.
func (m *Manager) scheduleProbeLocked(path string, e *entry, d time.Duration, batch bool) {
	if m.opts.ProbeInterval < 0 {
		return
	}
	e.stopProbe()
	d = time.Duration(float64(d) * (0.9 + 0.2*rand.Float64()))
	step := min(m.opts.ProbeInterval/10, time.Second)
	if !batch || step <= 0 {
		e.probe = time.AfterFunc(d, func() {
			m.mu.Lock()
			e.probeDue = true
			m.mu.Unlock()
			m.queue.add(path)
		})
		return
	}
	n := time.Now().Add(d).UnixNano()/int64(step) + 1
	if len(m.batches[n]) == 0 {
		time.AfterFunc(time.Until(time.Unix(0, n*int64(step))), func() { m.startBatch(n) })
	}
	m.batches[n] = append(m.batches[n], batched{path, e})
	e.probeStep = n
}

// batched is a plugin whose probe is due at the end of a step.
type batched struct {
	path string
	e    *entry
}

// startBatch queues the probes due at the end of step n; those rescheduled
// or stopped since are no longer due then.
func (m *Manager) startBatch(n int64) {
	m.mu.Lock()
	due := m.batches[n]
	delete(m.batches, n)
	paths := make([]string, 0, len(due))
	for _, b := range due {
		if b.e.probeStep == n {
			b.e.probeStep = 0
			b.e.probeDue = true
			paths = append(paths, b.path)
		}
	}
	m.mu.Unlock()
	for _, path := range paths {
		m.queue.add(path)
	}
}

// stopProbe cancels e's next probe, batched or not.
func (e *entry) stopProbe() {
	if e.probe != nil {
		e.probe.Stop()
		e.probe = nil
	}
	e.probeStep = 0
}

// graceLocked is how long a plugin of type typ may stay Unhealthy.
func (m *Manager) graceLocked(typ string) time.Duration {
	if d, ok := m.opts.GracePeriods[typ]; ok {
		return d
	}
	return m.opts.UnhealthyGrace
}

// samePlugin reports whether a probe's answer is the plugin that registered.
func samePlugin(a, b Plugin) bool {
	return a.Type == b.Type && a.Name == b.Name && a.Endpoint == b.Endpoint && slices.Equal(a.Versions, b.Versions)
}

// probe asks a registered plugin who it is. An answer keeps it (or makes it
// again) Registered, without a word to its handler; no answer makes it
// Unhealthy at once, and deregistered once that has lasted its grace period;
// a different answer is a different plugin, registered afresh.
func (m *Manager) probe(ctx context.Context, path string, e *entry) {
	m.mu.Lock()
	reg := e.reg
	var held *unaryconn.Conn
	if reg != nil && e.hang != nil {
		held = m.hangups.take(e.hang)
		e.hang = nil
	}
	m.mu.Unlock()
	if reg == nil {
		return
	}
	p, conn, err := m.ask(ctx, path, held)
	if ctx.Err() != nil {
		closeConn(conn)
		return // shutting down
	}
	if err == nil && !samePlugin(p, reg.plugin) {
		closeConn(conn)
		m.log.Info("plugin answers with different info; registering it afresh", "socket", path,
			"was", reg.plugin.Type+"/"+reg.plugin.Name, "now", p.Type+"/"+p.Name)
		m.mu.Lock()
		e.reg = nil
		m.mu.Unlock()
		if !m.deregister(ctx, e, reg) {
			return
		}
		m.mu.Lock()
		e.status = PluginStatus{Plugin: Plugin{Socket: path}, State: StatePending, Discovered: time.Now(), Created: e.status.Created}
		e.backoff = m.newBackoff()
		m.publishLocked(EventDiscovered, e)
		m.mu.Unlock()
		m.queue.add(path)
		return
	}

	m.mu.Lock()
	now := time.Now()
	label := m.typeLabelLocked(reg.plugin.Type)
	if err == nil {
		if e.status.State == StateUnhealthy {
			e.status.State = StateRegistered
			e.status.UnhealthySince = time.Time{}
			e.status.Reason, e.status.LastError = "", ""
			m.publishLocked(EventHealthy, e)
			m.log.Info("plugin answers again", "socket", path, "type", reg.plugin.Type, "name", reg.plugin.Name)
		}
		m.scheduleProbeLocked(path, e, m.opts.ProbeInterval, true)
		m.mu.Unlock()
		m.armHangup(ctx, path, e, conn)
		return
	}
	if e.status.State == StateRegistered {
		e.status.State = StateUnhealthy
		e.status.UnhealthySince = now
		e.status.Reason, e.status.LastError = ReasonUnhealthy, printable(err.Error())
		m.metrics.failures.WithLabelValues(label, string(ReasonUnhealthy)).Inc()
		m.publishLocked(EventUnhealthy, e)
		m.log.Warn("plugin stopped answering", "socket", path, "type", reg.plugin.Type, "name", reg.plugin.Name, "err", e.status.LastError)
	} else {
		e.status.LastError = printable(err.Error())
	}
	left := m.graceLocked(reg.plugin.Type) - now.Sub(e.status.UnhealthySince)
	if left > 0 {
		m.scheduleProbeLocked(path, e, min(m.opts.ProbeInterval, left), false)
		m.mu.Unlock()
		return
	}
	e.reg = nil
	m.mu.Unlock()

	// The grace period is over: let it go. It is tried again at every probe
	// interval (and at once if its socket is re-created).
	if !m.deregister(ctx, e, reg) {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	e.status.Plugin = reg.plugin
	e.status.State = StateFailed
	e.status.Reason, e.status.LastError = ReasonUnhealthy, printable(fmt.Sprintf("deregistered after not answering for %s: %v", m.graceLocked(reg.plugin.Type), err))
	e.status.NextRetry = now.Add(m.opts.ProbeInterval)
	e.retry = time.AfterFunc(m.opts.ProbeInterval, func() { m.queue.add(path) })
	m.publishLocked(EventFailed, e)
}

// ask asks the plugin at path who it is, with GetInfo's deadline: on conn if
// that is open, else on a new connection, which it returns open with the
// answer. A held connection that turns out closed (a plugin's server may
// close idle connections, or be gone) is not an answer: a new one tells
// which.
func (m *Manager) ask(ctx context.Context, path string, conn *unaryconn.Conn) (Plugin, *unaryconn.Conn, error) {
	if conn != nil {
		p, err := m.askOn(ctx, conn, path)
		if err == nil {
			return p, conn, nil
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
	conn, err := m.dial(ctx, path)
	if err != nil {
		return Plugin{}, nil, dialFailure{err}
	}
	p, err := m.askOn(ctx, conn, path)
	if err != nil {
		conn.Close()
		return Plugin{}, nil, err
	}
	return p, conn, nil
}

// askOn is GetInfo on conn, with its deadline, checked as at registration.
func (m *Manager) askOn(ctx context.Context, conn *unaryconn.Conn, path string) (Plugin, error) {
	infoCtx, cancel := context.WithTimeoutCause(ctx, m.opts.GetInfoTimeout,
		fmt.Errorf("no answer within %s", m.opts.GetInfoTimeout))
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
func (m *Manager) removeIfStaleLocked(e *entry) {
	if m.opts.RemoveStaleAfter <= 0 || time.Since(e.status.Created) < m.opts.RemoveStaleAfter {
		return
	}
	if id, ok := statSocket(e.status.Socket); !ok || id != e.id {
		return
	}
	if err := os.Remove(e.status.Socket); err != nil {
		m.log.Warn("could not remove a stale socket", "socket", e.status.Socket, "err", err)
		return
	}
	m.log.Info("removed a stale socket", "socket", e.status.Socket, "age", time.Since(e.status.Created).Round(time.Second))
}

// armHangup keeps conn, idle, to tell at once when a registered plugin's
// process goes away (see hangups). A nil or unusable conn is replaced by a
// new one, so armHangup may dial: m.mu must not be held.
func (m *Manager) armHangup(ctx context.Context, path string, e *entry, conn *unaryconn.Conn) {
	if m.hangups == nil {
		closeConn(conn)
		return
	}
	if conn == nil || !conn.Usable() {
		closeConn(conn)
		var err error
		conn, err = m.dial(ctx, path)
		if err != nil {
			m.log.Debug("cannot watch the plugin's connection; relying on probes", "socket", path, "err", err)
			return
		}
		// No call went over it: Idle sends what the handshake still owes.
		if !conn.Idle() {
			conn.Close()
			return
		}
	}
	w, err := m.hangups.watch(path, conn)
	if err != nil {
		m.log.Debug("cannot watch the plugin's connection; relying on probes", "socket", path, "err", err)
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.entries[path] != e || e.hang != nil || e.reg == nil {
		m.hangups.unwatch(w) // replaced, gone or deregistered meanwhile, or already watched
		return
	}
	if !m.hangups.watching(w) {
		// Hung up before e held it: hungUp, not knowing w, let it pass.
		e.probeDue = true
		m.queue.add(path)
		return
	}
	e.hang = w
}

// hungUp is told that a watched connection was hung up: the plugin is probed
// at once.
func (m *Manager) hungUp(w *hangup) {
	m.mu.Lock()
	e := m.entries[w.path]
	if e == nil || e.hang != w {
		m.mu.Unlock()
		return
	}
	e.hang = nil
	e.probeDue = true
	m.mu.Unlock()
	m.queue.add(w.path)
}
