package pluginmanager

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/plugd/plugd/internal/confine"
)

// stepOutcomeOf, what a failed step of a registration attempt comes to, from
// the step and its error alone.
func TestStepVerdict(t *testing.T) {
	refusedDial := fmt.Errorf("connect /r/p.sock: %w", syscall.ECONNREFUSED)
	changed := fmt.Errorf("connect /r/p.sock: %w", confine.ErrChanged)
	fault := &handlerFault{context.DeadlineExceeded}
	tests := []struct {
		name string
		at   attemptStep
		err  error
		want stepOutcome
	}{
		{"dial refused", atDial, refusedDial, stepOutcome{reason: ReasonDial}},
		{"socket changed while connecting", atDial, changed, stepOutcome{gone: true}},
		{"socket changed while asking", atGetInfo, changed, stepOutcome{gone: true}},
		{"handshake failed", atGetInfo, dialFailure{errors.New("no SETTINGS")}, stepOutcome{reason: ReasonDial}},
		{"GetInfo failed", atGetInfo, status.Error(codes.Unavailable, "x"), stepOutcome{reason: ReasonGetInfo}},
		{"GetInfo unimplemented", atGetInfo, status.Error(codes.Unimplemented, "x"), stepOutcome{reason: ReasonGetInfo, terminal: true}},
		{"GetInfo answer too large", atGetInfo, status.Error(codes.ResourceExhausted, "x"), stepOutcome{reason: ReasonInvalidInfo, terminal: true, tell: true}},
		{"answer breaks a rule", atInfo, errInvalidInfo, stepOutcome{reason: ReasonInvalidInfo, terminal: true, tell: true}},
		{"refused by the options' rules", atPolicy, errors.New("outside"), stepOutcome{reason: ReasonPolicy, terminal: true, tell: true}},
		{"no handler", atHandler, errNoHandler, stepOutcome{reason: ReasonNoHandler, terminal: true, tell: true}},
		{"Validate refused", atValidate, errors.New("no"), stepOutcome{reason: ReasonValidate, terminal: true, tell: true}},
		{"Validate timed out", atValidate, fault, stepOutcome{reason: ReasonValidate, tell: true, endpoint: true}},
		{"a kubelet handler's Validate refused", atValidate, &retryableError{errors.New("no")}, stepOutcome{reason: ReasonValidate, tell: true, endpoint: true}},
		{"Register failed", atRegister, errors.New("busy"), stepOutcome{reason: ReasonRegister, tell: true, endpoint: true}},
		{"Register refused for good", atRegister, TerminalError(errors.New("never")), stepOutcome{reason: ReasonRegister, terminal: true, tell: true}},
		{"Register timed out: kept, to be taken back", atRegister, fault, stepOutcome{reason: ReasonRegister, tell: true, keep: true, endpoint: true}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := stepOutcomeOf(tc.at, tc.err)
			if !got.failed || got.err == nil {
				t.Errorf("stepOutcomeOf = %+v: not a failure with its error", got)
			}
			got.failed, got.err = false, nil
			if got != tc.want {
				t.Errorf("stepOutcomeOf = %+v, want %+v", got, tc.want)
			}
		})
	}
	if v := stepOutcomeOf(atGetInfo, status.Error(codes.ResourceExhausted, "x")); !errors.Is(v.err, errInvalidInfo) {
		t.Errorf("an answer too large is recorded as %v, want invalid info", v.err)
	}
}

// decideFailure, how a failed attempt is recorded, from the facts alone.
func TestDecideFailure(t *testing.T) {
	now := time.Unix(1e9, 0)
	const delay = 3 * time.Second
	old, young := now.Add(-2*time.Hour), now.Add(-time.Minute)
	tests := []struct {
		name  string
		in    failFacts
		want  failOutcome
		waits bool // the backoff was taken
	}{
		{"cut short by shutdown", failFacts{shutdown: true, reason: ReasonDial}, failOutcome{kind: failCut, state: StatePending}, false},
		{"bound, not listening yet", failFacts{reason: ReasonDial, refused: true, quiet: now.Add(20 * time.Millisecond)},
			failOutcome{kind: failQuiet, state: StatePending, due: now.Add(20 * time.Millisecond), at: now.Add(20 * time.Millisecond)}, false},
		{"out of file descriptors", failFacts{reason: ReasonDial, outOfFDs: true},
			failOutcome{kind: failOurs, state: StatePending, due: now.Add(delay), at: now.Add(delay), delay: delay}, true},
		{"failed", failFacts{reason: ReasonGetInfo}, failOutcome{kind: failRetried, state: StateFailed, due: now.Add(delay), at: now.Add(delay), delay: delay}, true},
		{"waiting for its endpoint: looked at again within awaitPoll", failFacts{reason: ReasonEndpoint, awaiting: true, created: old, staleAfter: time.Hour},
			failOutcome{kind: failRetried, state: StateFailed, due: now.Add(awaitPoll), at: now.Add(awaitPoll), delay: awaitPoll}, true},
		{"nobody listens: stale", failFacts{reason: ReasonDial, refused: true, created: old},
			failOutcome{kind: failRetried, state: StateStale, due: now.Add(delay), at: now.Add(delay), delay: delay}, true},
		{"stale and old: removed", failFacts{reason: ReasonDial, refused: true, created: old, staleAfter: time.Hour},
			failOutcome{kind: failRetried, state: StateStale, due: now.Add(delay), at: now.Add(delay), delay: delay, removeStale: true}, true},
		{"stale and young: kept", failFacts{reason: ReasonDial, refused: true, created: young, staleAfter: time.Hour},
			failOutcome{kind: failRetried, state: StateStale, due: now.Add(delay), at: now.Add(delay), delay: delay}, true},
		{"refused after it answered: failed, not stale", failFacts{reason: ReasonRegister, refused: true, created: old, staleAfter: time.Hour},
			failOutcome{kind: failRetried, state: StateFailed, due: now.Add(delay), at: now.Add(delay), delay: delay}, true},
		{"rejected", failFacts{reason: ReasonValidate, terminal: true}, failOutcome{kind: failRejected, state: StateRejected}, false},
		{"rejected, looked at again once old", failFacts{reason: ReasonValidate, terminal: true, created: young, staleAfter: time.Hour},
			failOutcome{kind: failRejected, state: StateRejected, due: young.Add(time.Hour), at: young.Add(time.Hour)}, false},
		{"rejected and old already: looked at now", failFacts{reason: ReasonValidate, terminal: true, created: old, staleAfter: time.Hour},
			failOutcome{kind: failRejected, state: StateRejected, due: now, at: now}, false},
		{"no handler, one added meanwhile: tried again now", failFacts{reason: ReasonNoHandler, terminal: true, handled: true},
			failOutcome{kind: failRejected, state: StateRejected, at: now}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			waited := false
			tc.in.now = now
			tc.in.backoff = func() time.Duration { waited = true; return delay }
			if got := decideFailure(tc.in); got != tc.want || waited != tc.waits {
				t.Errorf("decideFailure = %+v (backoff taken: %t), want %+v (%t)", got, waited, tc.want, tc.waits)
			}
		})
	}
}

// mayAwaitEndpoint, whether a failed attempt may wait for the plugin's
// endpoint instead of telling the plugin, from the outcome and what the
// plugin announced alone.
func TestMayAwaitEndpoint(t *testing.T) {
	const socket, endpoint = "/r/p.sock", "/csi/csi.sock"
	busy, never := errors.New("busy"), TerminalError(errors.New("never"))
	tests := []struct {
		name     string
		v        stepOutcome
		endpoint string
		want     bool
	}{
		{"Register failed, endpoint of its own", stepOutcomeOf(atRegister, busy), endpoint, true},
		{"Register timed out, endpoint of its own", stepOutcomeOf(atRegister, &handlerFault{context.DeadlineExceeded}), endpoint, true},
		{"Validate failed, not for good", stepOutcomeOf(atValidate, &retryableError{busy}), endpoint, true},
		{"Register refused for good", stepOutcomeOf(atRegister, never), endpoint, false},
		{"Validate refused", stepOutcomeOf(atValidate, busy), endpoint, false},
		{"no endpoint announced: its registration socket", stepOutcomeOf(atRegister, busy), socket, false},
		{"no endpoint at all", stepOutcomeOf(atRegister, busy), "", false},
		{"a bad GetInfo answer", stepOutcomeOf(atInfo, errInvalidInfo), endpoint, false},
		{"refused by the options' rules", stepOutcomeOf(atPolicy, errors.New("outside")), endpoint, false},
		{"no handler", stepOutcomeOf(atHandler, errNoHandler), endpoint, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := Plugin{Type: "CSIPlugin", Name: "csi", Endpoint: tc.endpoint, Socket: socket}
			if got := mayAwaitEndpoint(tc.v, p); got != tc.want {
				t.Errorf("mayAwaitEndpoint(%+v, endpoint %q) = %t, want %t", tc.v, tc.endpoint, got, tc.want)
			}
		})
	}
}
