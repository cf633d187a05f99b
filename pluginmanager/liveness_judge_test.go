package pluginmanager

import (
	"errors"
	"testing"
	"time"
)

// judgeHealth, whether a registered plugin is Registered or Unhealthy and
// whether its grace is over, from what the last looks found alone.
func TestJudgeHealth(t *testing.T) {
	now := time.Unix(1e9, 0)
	const grace = 30 * time.Second
	down, dead := errors.New("endpoint down"), errors.New("connection refused")
	registered := health{state: StateRegistered, grace: grace, now: now}
	unhealthy := health{state: StateUnhealthy, reason: ReasonUnhealthy, lastError: "refused", since: now.Add(-time.Second), grace: grace, now: now}
	with := func(h health, f func(*health)) health { f(&h); return h }
	tests := []struct {
		name string
		in   health
		want judgement
	}{
		{"answers", registered, judgement{state: StateRegistered}},
		{"answers, a note of a failed notification kept", with(registered, func(h *health) { h.reason, h.lastError = ReasonNotify, "not told" }),
			judgement{state: StateRegistered, reason: ReasonNotify, lastError: "not told"}},
		{"its socket stopped answering", with(registered, func(h *health) { h.socketErr = dead }),
			judgement{state: StateUnhealthy, reason: ReasonUnhealthy, lastError: "connection refused", since: now, why: dead, failed: true, graceEnd: now.Add(grace)}},
		{"its endpoint went", with(registered, func(h *health) { h.endpointKnown, h.endpointErr = true, down }),
			judgement{state: StateUnhealthy, reason: ReasonEndpoint, lastError: "endpoint down", since: now, why: down, failed: true, graceEnd: now.Add(grace)}},
		{"still unhealthy", with(unhealthy, func(h *health) { h.socketErr = dead }),
			judgement{state: StateUnhealthy, reason: ReasonUnhealthy, lastError: "connection refused", since: unhealthy.since, why: dead, repeated: true, graceEnd: unhealthy.since.Add(grace)}},
		{"unhealthy for another reason now", with(unhealthy, func(h *health) { h.endpointKnown, h.endpointErr = true, down }),
			judgement{state: StateUnhealthy, reason: ReasonEndpoint, lastError: "endpoint down", since: unhealthy.since, why: down, failed: true, graceEnd: unhealthy.since.Add(grace)}},
		{"answers again", unhealthy, judgement{state: StateRegistered, recovered: true}},
		{"grace over: let go", with(unhealthy, func(h *health) { h.socketErr, h.since = dead, now.Add(-grace) }),
			judgement{state: StateUnhealthy, reason: ReasonUnhealthy, lastError: "connection refused", since: now.Add(-grace), why: dead, repeated: true, graceEnd: now, letGo: true}},
		{"a grace for ever: kept", with(unhealthy, func(h *health) { h.socketErr, h.since, h.grace = dead, now.Add(-24*time.Hour), -1 }),
			judgement{state: StateUnhealthy, reason: ReasonUnhealthy, lastError: "connection refused", since: now.Add(-24 * time.Hour), why: dead, repeated: true}},
		{"its registrar went, its endpoint serves: kept, said once", with(registered, func(h *health) { h.socketErr, h.endpointKnown = dead, true }),
			judgement{state: StateRegistered, reason: ReasonUnhealthy, lastError: keptNote(dead), kept: true, noted: true}},
		{"kept, said already", with(registered, func(h *health) { h.socketErr, h.endpointKnown, h.noted = dead, true, true }),
			judgement{state: StateRegistered, reason: ReasonUnhealthy, lastError: keptNote(dead), noted: true}},
		{"its registrar went, deregistered with it", with(registered, func(h *health) { h.socketErr, h.endpointKnown, h.withRegistrar = dead, true, true }),
			judgement{state: StateUnhealthy, reason: ReasonUnhealthy, lastError: "connection refused", since: now, why: dead, failed: true, graceEnd: now.Add(grace)}},
		{"its registrar back: the note cleared", with(registered, func(h *health) { h.reason, h.lastError, h.endpointKnown, h.noted = ReasonUnhealthy, "note", true, true }),
			judgement{state: StateRegistered}},
		{"its endpoint back, its registrar gone: Healthy, then kept", with(unhealthy, func(h *health) { h.reason, h.socketErr, h.endpointKnown = ReasonEndpoint, dead, true }),
			judgement{state: StateRegistered, reason: ReasonUnhealthy, lastError: keptNote(dead), recovered: true, kept: true, noted: true}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := judgeHealth(tc.in); got != tc.want {
				t.Errorf("judgeHealth =\n%+v, want\n%+v", got, tc.want)
			}
		})
	}
}

func keptNote(err error) string {
	return "its registration socket does not answer (" + err.Error() + "); kept registered while its endpoint serves"
}
