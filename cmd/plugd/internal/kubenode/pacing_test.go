package kubenode

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/clock"
	testclock "k8s.io/utils/clock/testing"

	"github.com/plugd/plugd/internal/testenv"
)

// Writes the API server refuses are retried after a delay that doubles
// from writeBackoffMin up to writeBackoffMax, each spread by writeJitter
// around its step; a write that succeeds starts the delay afresh. The test
// moves the fake clock from one evaluation to the next the loop asks for,
// as Run does.
func TestWriteBackoff(t *testing.T) {
	b := newBench(t)
	started := b.clock.Now().Add(-time.Hour)
	sock := csiSocket(started, true)
	b.setPlugins(sock)
	b.setKubelet(started, sock.Path)
	var refuse atomic.Bool
	refuse.Store(true)
	b.cs.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		if refuse.Load() {
			return true, nil, apierrors.NewServiceUnavailable("the API server is down")
		}
		return false, nil, nil
	})
	// tries evaluates, from now on, until n writes were tried, and
	// returns when each was.
	tries := func(n int) []time.Time {
		t.Helper()
		var at []time.Time
		for i := 0; len(at) < n; i++ {
			if i > 10*n {
				t.Fatalf("%d writes tried in %d evaluations; want %d", len(at), i, n)
			}
			now, before := b.clock.Now(), len(b.writes())
			next := b.l.evaluate(context.Background(), now)
			if len(b.writes()) > before {
				at = append(at, now)
			}
			if !next.After(now) {
				next = now.Add(minEvalGap)
			}
			b.clock.SetTime(next)
		}
		return at
	}
	// checkGaps holds the gaps between the tries at against the backoff.
	checkGaps := func(at []time.Time) {
		t.Helper()
		step := writeBackoffMin
		for i := 1; i < len(at); i++ {
			gap := at[i].Sub(at[i-1])
			lo := time.Duration(float64(step) * (1 - writeJitter))
			hi := min(time.Duration(float64(step)*(1+writeJitter)), writeBackoffMax)
			if gap < lo || gap > hi {
				t.Errorf("write %d was tried %s after the one before; want %s to %s", i+1, gap, lo, hi)
			}
			step = min(2*step, writeBackoffMax)
		}
	}

	// 1 s, 2 s, ... 64 s, then 2 minutes at most: 12 tries reach the cap.
	at := tries(12)
	checkGaps(at)
	if p := b.n.Problems(); len(p) != 1 || p[0].Reason != ReasonAPIUnavailable || !p[0].Since.Equal(at[0]) {
		t.Errorf("problems while writes fail: %+v", p)
	}

	refuse.Store(false)
	b.step(0)
	for b.condition() == nil {
		b.step(writeBackoffMax) // the next try is at most this far
	}
	if c := b.condition(); c.Status != corev1.ConditionTrue {
		t.Fatalf("condition once writes work: %+v", c)
	}
	if p := b.n.Problems(); len(p) != 0 {
		t.Errorf("problems once a write worked: %+v", p)
	}

	// The socket dies, and the API server is down again: the delay starts
	// from writeBackoffMin.
	refuse.Store(true)
	b.setPlugins(csiSocket(started, false))
	checkGaps(tries(3))
}

// lockstepClock is a fake clock whose timers tell the test each Reset once
// they are re-armed: a test that reads them knows where Run is, with no
// sleep. Nothing fires in between, since only the test steps the clock;
// and a Step the test makes next finds the timer armed (told before, a
// Step could come first, and Run's timer never fire).
type lockstepClock struct {
	*testclock.FakeClock
	resets chan time.Duration
	done   chan struct{}
}

func (c lockstepClock) NewTimer(d time.Duration) clock.Timer {
	return lockstepTimer{c.FakeClock.NewTimer(d), c}
}

type lockstepTimer struct {
	clock.Timer
	c lockstepClock
}

func (t lockstepTimer) Reset(d time.Duration) bool {
	active := t.Timer.Reset(d)
	select {
	case t.c.resets <- d:
	case <-t.c.done:
	}
	return active
}

// Run evaluates at once on a change, then at most once per minEvalGap
// however many changes come, and every localResync when nothing does.
func TestRunPacing(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clk := lockstepClock{testclock.NewFakeClock(t0), make(chan time.Duration), make(chan struct{})}
	evals := make(chan time.Time, 100)
	// An empty API: its informers tell of no change, only the test does.
	cs := fake.NewClientset()
	n, err := newNode(Config{NodeName: "node-a", Clock: clk, Sockets: func() []Socket {
		evals <- clk.Now()
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	n.core, n.storage, n.resource, n.events, n.fakeAPI = cs.CoreV1(), cs.StorageV1(), cs.ResourceV1(), cs.EventsV1(), cs
	n.build(nil)
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		n.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		close(clk.done)
		<-stopped
	})

	// next is the next Reset of Run's timer, and the evaluations made
	// before it.
	next := func() (time.Duration, []time.Time) {
		t.Helper()
		select {
		case d := <-clk.resets:
			var got []time.Time
			for len(evals) > 0 {
				got = append(got, <-evals)
			}
			return d, got
		case <-time.After(testenv.Timeout):
			t.Fatalf("Run did not set its timer within %v", testenv.Timeout)
			return 0, nil
		}
	}
	expect := func(what string, wantWait time.Duration, wantEvals ...time.Time) {
		t.Helper()
		d, got := next()
		if d != wantWait || len(got) != len(wantEvals) {
			t.Fatalf("%s: evaluations at %v, then a wait of %s; want %v, then %s", what, got, d, wantEvals, wantWait)
		}
		for i := range got {
			if !got[i].Equal(wantEvals[i]) {
				t.Fatalf("%s: evaluations at %v; want %v", what, got, wantEvals)
			}
		}
	}

	n.Changed()
	expect("the first change", localResync, t0)
	for range 5 {
		n.Changed()
		expect("a change within the gap", minEvalGap)
	}
	into := minEvalGap * 3 / 5
	clk.Step(into)
	n.Changed()
	expect("a change within the gap, after the evaluation", minEvalGap-into)
	clk.Step(minEvalGap - into)
	expect("the gap's end", localResync, t0.Add(minEvalGap))
	clk.Step(localResync - time.Millisecond)
	clk.Step(time.Millisecond)
	expect("nothing changed for localResync", localResync, t0.Add(minEvalGap+localResync))
	if len(evals) != 0 {
		t.Errorf("evaluations the pacing did not ask for: %d", len(evals))
	}
}
