package pluginmanager

import (
	"errors"
	"fmt"
	"syscall"
	"testing"
	"time"
)

// observeStep, what a look at an observed socket does, from the facts
// alone.
func TestObserveStep(t *testing.T) {
	now := time.Unix(1e9, 0)
	later, earlier := now.Add(time.Second), now.Add(-time.Second)
	answering := observation{state: StateAnswering, held: true, probeAt: later, now: now}
	failing := observation{state: StateNotAnswering, reason: ReasonGetInfo, redialAt: later, now: now}
	with := func(o observation, f func(*observation)) observation { f(&o); return o }
	tests := []struct {
		name string
		in   observation
		want ostep
	}{
		{"new", observation{state: StatePending, now: now}, oLook},
		{"new, bound and not listening yet", observation{state: StatePending, due: later, now: now}, oWait},
		{"new, its path too long", observation{state: StatePending, tooLong: true, now: now}, oUnreachable},
		{"its path too long, said already", observation{state: StateNotAnswering, reason: ReasonDial, tooLong: true, now: now}, oDone},
		{"answering, nothing due", answering, oLater},
		{"answering, its probe due", with(answering, func(o *observation) { o.probeAt = earlier }), oLook},
		{"answering, no probes", with(answering, func(o *observation) { o.probeAt = time.Time{} }), oLater},
		{"answering, its endpoint reported down", with(answering, func(o *observation) { o.endpointKnown, o.endpointDown = true, true }), oDown},
		{"answering, hung up", with(answering, func(o *observation) { o.held = false }), oRedial},
		{"answering, hung up, redial backed off", with(answering, func(o *observation) { o.held, o.redialAt = false, later }), oLater},
		{"not answering, retry not due", failing, oLater},
		{"not answering, retry due", with(failing, func(o *observation) { o.redialAt = earlier }), oLook},
		{"stale, retry due", with(failing, func(o *observation) { o.state, o.reason, o.redialAt = StateStale, ReasonDial, now }), oLook},
		{"its endpoint down, reported back", with(failing, func(o *observation) { o.reason, o.endpointKnown = ReasonEndpoint, true }), oLook},
		{"its endpoint down, still", with(failing, func(o *observation) { o.reason, o.endpointKnown, o.endpointDown = ReasonEndpoint, true, true }), oLater},
		{"its endpoint down, awaited, due", with(failing, func(o *observation) { o.reason, o.awaiting, o.redialAt = ReasonEndpoint, true, earlier }), oAwait},
		{"its endpoint down, awaited, not due", with(failing, func(o *observation) { o.reason, o.awaiting = ReasonEndpoint, true }), oLater},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := observeStep(tc.in); got != tc.want {
				t.Errorf("observeStep(%+v) = %d, want %d", tc.in, got, tc.want)
			}
		})
	}
}

// lookVerdict, how a look at an observed plugin is recorded.
func TestLookVerdict(t *testing.T) {
	refusedDial := dialFailure{fmt.Errorf("connect: %w", syscall.ECONNREFUSED)}
	tests := []struct {
		name      string
		was       State
		wasReason Reason
		err       error
		endpoint  bool
		state     State
		reason    Reason
		ev        EventType
		news      bool
	}{
		{"first answer", StatePending, "", nil, false, StateAnswering, "", EventAnswering, true},
		{"answers again", StateNotAnswering, ReasonGetInfo, nil, false, StateAnswering, "", EventAnswering, true},
		{"answers, as before", StateAnswering, "", nil, false, StateAnswering, "", EventLooked, false},
		{"its GetInfo failed", StateAnswering, "", errors.New("unavailable"), false, StateNotAnswering, ReasonGetInfo, EventNotAnswering, true},
		{"its GetInfo failed, as before", StateNotAnswering, ReasonGetInfo, errors.New("unavailable"), false, StateNotAnswering, ReasonGetInfo, EventLooked, false},
		{"nobody listens", StatePending, "", refusedDial, false, StateStale, ReasonDial, EventNotAnswering, true},
		{"no HTTP/2", StateAnswering, "", dialFailure{errors.New("no SETTINGS")}, false, StateNotAnswering, ReasonDial, EventNotAnswering, true},
		{"nonsense", StatePending, "", errInvalidInfo, false, StateNotAnswering, ReasonInvalidInfo, EventNotAnswering, true},
		{"its endpoint does not serve", StateAnswering, "", errors.New("not ready"), true, StateNotAnswering, ReasonEndpoint, EventNotAnswering, true},
		{"its endpoint still does not serve", StateNotAnswering, ReasonEndpoint, errors.New("not ready"), true, StateNotAnswering, ReasonEndpoint, EventLooked, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			state, reason, ev, news := lookVerdict(tc.was, tc.wasReason, tc.err, tc.endpoint)
			if state != tc.state || reason != tc.reason || ev != tc.ev || news != tc.news {
				t.Errorf("lookVerdict = %s %s %s %t, want %s %s %s %t", state, reason, ev, news, tc.state, tc.reason, tc.ev, tc.news)
			}
		})
	}
}
