package kubenode

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"
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
	b.setKubelet(started, sock.Socket)
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
