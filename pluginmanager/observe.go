package pluginmanager

import (
	"context"
	"errors"
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

// statesLocked are the states this manager reports.
func (m *Manager) statesLocked() []State {
	if m.opts.Observe {
		return []State{StatePending, StateAnswering, StateNotAnswering, StateStale}
	}
	return []State{StatePending, StateRegistering, StateRegistered, StateFailed, StateRejected, StateStale, StateUnhealthy}
}

// observe asks a plugin who it is, and records what it saw: no notification,
// no handler, nothing written. The next look is a probe interval away.
func (m *Manager) observe(ctx context.Context, path string, e *entry) {
	p, conn, err := m.ask(ctx, path, nil)
	closeConn(conn) // looks are far apart: no connection is kept between them
	endpointFailed := false
	if err == nil {
		m.mu.Lock()
		obs, _ := m.handlers[p.Type].(Observer)
		m.mu.Unlock()
		if obs != nil {
			err = m.callHandler(ctx, e, "Observe", func(ctx context.Context) error { return obs.Observe(ctx, p) })
			endpointFailed = err != nil
		}
	}
	if ctx.Err() != nil {
		return // shutting down
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	was := e.status.State
	e.status.Attempts++
	if err == nil {
		e.status.Plugin = p
		e.status.State = StateAnswering
		e.status.Reason, e.status.LastError = "", ""
		e.status.UnhealthySince = time.Time{}
		if was != StateAnswering {
			m.publishLocked(EventAnswering, e)
			m.log.Info("plugin answers", "socket", path, "type", p.Type, "name", p.Name, "endpoint", p.Endpoint)
		}
	} else {
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
			e.status.UnhealthySince = time.Now()
		}
		if was != state {
			m.metrics.failures.WithLabelValues(m.typeLabelLocked(e.status.Type), string(reason)).Inc()
			m.publishLocked(EventNotAnswering, e)
			m.log.Warn("plugin does not answer", "socket", path, "type", e.status.Type, "name", e.status.Name, "state", state, "err", e.status.LastError)
		}
	}
	m.scheduleProbeLocked(path, e, m.opts.ProbeInterval, true)
}
