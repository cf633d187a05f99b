package pluginmanager

import (
	"testing"
	"time"
)

// nextStep, the registrar's decision of what a look at a path does, from
// the facts alone: no socket, no handler, no clock.
func TestNextStep(t *testing.T) {
	now := time.Unix(1e9, 0)
	later, earlier := now.Add(time.Second), now.Add(-time.Second)
	// known is a path with an entry for the file there.
	known := sighting{present: true, known: true, sameFile: true, now: now}
	with := func(s sighting, f func(*sighting)) sighting { f(&s); return s }
	registered := with(known, func(s *sighting) { s.state, s.held, s.heldFile, s.handled = StateRegistered, true, true, true })
	tests := []struct {
		name string
		in   sighting
		want step
	}{
		{"nothing there, nothing known", sighting{now: now}, stepDone},
		{"a new socket", sighting{present: true, now: now}, stepDiscover},
		{"another file at a known path", with(known, func(s *sighting) { s.sameFile = false; s.state = StateStale }), stepDiscover},
		{"a known socket gone", with(known, func(s *sighting) { s.present = false; s.state = StateFailed }), stepForget},
		{"a registered socket gone: taken back first", with(registered, func(s *sighting) { s.present = false }), stepTakeBack},
		{"a registered socket replaced: taken back first", with(registered, func(s *sighting) { s.sameFile, s.heldFile = false, false }), stepTakeBack},
		{"a registration a timed-out Register left: taken back before a retry", with(registered, func(s *sighting) { s.state = StateFailed }), stepTakeBack},
		{"registered: liveness", registered, stepLive},
		{"unhealthy: liveness", with(registered, func(s *sighting) { s.state = StateUnhealthy }), stepLive},
		{"registered, no handler any more", with(registered, func(s *sighting) { s.handled = false }), stepDone},
		{"registered, let go at shutdown: registered again", with(known, func(s *sighting) { s.state = StateRegistered; s.handled = true }), stepRegister},
		{"pending", with(known, func(s *sighting) { s.state = StatePending }), stepRegister},
		{"pending, a quiet retry not due", with(known, func(s *sighting) { s.state, s.due = StatePending, later }), stepWait},
		{"failed, retry not due", with(known, func(s *sighting) { s.state, s.due = StateFailed, later }), stepWait},
		{"failed, retry due", with(known, func(s *sighting) { s.state, s.due = StateFailed, earlier }), stepRegister},
		{"stale, retry due", with(known, func(s *sighting) { s.state, s.due = StateStale, now }), stepRegister},
		{"failed, waiting for its endpoint", with(known, func(s *sighting) { s.state, s.due, s.awaiting = StateFailed, earlier, true }), stepAwait},
		{"failed, waiting for its endpoint, not due", with(known, func(s *sighting) { s.state, s.due, s.awaiting = StateFailed, later, true }), stepWait},
		{"rejected", with(known, func(s *sighting) { s.state, s.reason, s.handled = StateRejected, ReasonValidate, true }), stepStaleCheck},
		{"rejected for want of a handler, still none", with(known, func(s *sighting) { s.state, s.reason = StateRejected, ReasonNoHandler }), stepStaleCheck},
		{"rejected for want of a handler, one added", with(known, func(s *sighting) { s.state, s.reason, s.handled = StateRejected, ReasonNoHandler, true }), stepRegister},
		{"a path too long", with(known, func(s *sighting) { s.state, s.tooLong = StatePending, true }), stepRefuse},
		{"a path too long, rejected already", with(known, func(s *sighting) { s.state, s.reason, s.tooLong = StateRejected, ReasonDial, true }), stepStaleCheck},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := nextStep(tc.in); got != tc.want {
				t.Errorf("nextStep(%+v) = %d, want %d", tc.in, got, tc.want)
			}
		})
	}
}

// The steps that say "look again" change what the next look sees, so a
// look ends: after a registration taken back none is held, after a
// discovery the entry is the file's, after the endpoint serves nothing is
// awaited.
func TestNextStepMakesProgress(t *testing.T) {
	now := time.Unix(1e9, 0)
	for _, state := range []State{StatePending, StateRegistered, StateUnhealthy, StateFailed, StateStale, StateRejected} {
		for mask := range 1 << 7 {
			s := sighting{state: state, now: now,
				present: mask&1 != 0, known: mask&2 != 0, sameFile: mask&4 != 0, held: mask&8 != 0,
				heldFile: mask&16 != 0, handled: mask&32 != 0, awaiting: mask&64 != 0}
			if !s.known {
				s.sameFile, s.held, s.heldFile, s.awaiting = false, false, false, false
			}
			for steps := 0; ; steps++ {
				if steps > 3 {
					t.Fatalf("from %+v, a look takes more than 3 steps", s)
				}
				switch nextStep(s) {
				case stepTakeBack:
					s.held, s.heldFile = false, false
					continue
				case stepDiscover:
					s = sighting{present: true, known: true, sameFile: true, state: StatePending, handled: s.handled, now: now}
					continue
				case stepAwait:
					s.awaiting = false
					continue
				}
				break
			}
		}
	}
}
