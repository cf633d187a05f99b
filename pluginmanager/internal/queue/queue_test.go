package queue

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"k8s.io/utils/clock"
	testingclock "k8s.io/utils/clock/testing"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// started runs a queue on a fake clock until the test ends.
func started(t *testing.T) (*Queue, *testingclock.FakeClock) {
	t.Helper()
	clk := testingclock.NewFakeClock(time.Unix(1000, 0))
	q := New(clk)
	var wg sync.WaitGroup
	wg.Go(q.Run)
	t.Cleanup(func() {
		q.ShutDown()
		wg.Wait()
	})
	return q, clk
}

// get takes the next ready key, failing the test if none comes.
func get(t *testing.T, q *Queue) string {
	t.Helper()
	got := make(chan string, 1)
	go func() {
		k, ok := q.Get()
		if !ok {
			k = "(shut down)"
		}
		got <- k
	}()
	select {
	case k := <-got:
		return k
	case <-time.After(10 * time.Second):
		t.Fatal("no key became ready")
		return ""
	}
}

// readyNow returns the keys ready at once, taking them.
func readyNow(q *Queue) []string {
	q.mu.Lock()
	defer q.mu.Unlock()
	out := slices.Clone(q.ready)
	for _, k := range out {
		delete(q.dirty, k)
	}
	q.ready = nil
	return out
}

func TestAddDeduplicatesAndNeverHandsAKeyToTwoWorkers(t *testing.T) {
	q, _ := started(t)
	q.Add("a")
	q.Add("a")
	q.Add("b")
	if k := get(t, q); k != "a" {
		t.Fatalf("first key %q, want a", k)
	}
	q.Add("a") // while a worker has it
	if k := get(t, q); k != "b" {
		t.Fatalf("second key %q, want b: a is still being worked on", k)
	}
	q.mu.Lock()
	n := len(q.ready)
	q.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d keys ready while a is worked on, want none", n)
	}
	q.Done("a")
	if k := get(t, q); k != "a" {
		t.Fatalf("after Done, key %q, want a again", k)
	}
}

// Keys due at one time are handed out at one wake-up; none earlier.
func TestScheduledKeysFallDueTogether(t *testing.T) {
	q, clk := started(t)
	at := clk.Now().Add(10 * time.Second)
	for _, k := range []string{"a", "b", "c"} {
		q.Schedule(k, at)
	}
	q.Schedule("later", at.Add(time.Second))
	clk.Step(10*time.Second - time.Nanosecond)
	if got := readyNow(q); len(got) != 0 {
		t.Fatalf("ready %q a nanosecond early", got)
	}
	clk.Step(time.Nanosecond)
	got := []string{get(t, q), get(t, q), get(t, q)}
	slices.Sort(got)
	if !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Fatalf("due %q, want a, b and c", got)
	}
	if _, ok := q.Scheduled("later"); !ok {
		t.Error("the later key fell due too early")
	}
	clk.Step(time.Second)
	if k := get(t, q); k != "later" {
		t.Fatalf("key %q, want later", k)
	}
}

// The last Schedule of a key wins, earlier or later; zero cancels it.
func TestScheduleReplaces(t *testing.T) {
	q, clk := started(t)
	now := clk.Now()
	q.Schedule("a", now.Add(time.Second))
	q.Schedule("a", now.Add(time.Hour))
	q.Schedule("b", now.Add(time.Second))
	q.Schedule("b", time.Time{})
	clk.Step(time.Minute)
	q.Schedule("c", clk.Now()) // due: ready at once
	if k := get(t, q); k != "c" {
		t.Fatalf("key %q, want c alone: a was put off, b cancelled", k)
	}
	if at, ok := q.Scheduled("a"); !ok || !at.Equal(now.Add(time.Hour)) {
		t.Errorf("a scheduled at %v (%v), want in an hour", at, ok)
	}
	if _, ok := q.Scheduled("b"); ok {
		t.Error("b is still scheduled")
	}
	clk.Step(time.Hour)
	if k := get(t, q); k != "a" {
		t.Fatalf("key %q, want a", k)
	}
}

func TestShutDownEndsGetAndTheTimer(t *testing.T) {
	clk := testingclock.NewFakeClock(time.Unix(1000, 0))
	q := New(clk)
	var wg sync.WaitGroup
	wg.Go(q.Run)
	q.Schedule("a", clk.Now().Add(time.Second))
	got := make(chan bool)
	go func() { _, ok := q.Get(); got <- ok }()
	q.ShutDown()
	q.ShutDown()
	wg.Wait()
	if <-got {
		t.Error("Get handed out a key after ShutDown")
	}
	if clk.HasWaiters() {
		t.Error("the timer is still armed after ShutDown")
	}
	q.Add("b")
	q.Schedule("c", clk.Now())
	if _, ok := q.Get(); ok {
		t.Error("Get handed out a key after ShutDown")
	}
}

func BenchmarkQueue(b *testing.B) {
	q := New(clock.RealClock{})
	paths := make([]string, 1024)
	for i := range paths {
		paths[i] = fmt.Sprintf("/r/p%04d.sock", i)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		p := paths[i%len(paths)]
		i++
		q.Add(p)
		got, _ := q.Get()
		q.Done(got)
	}
}

// A key due, handed out and scheduled again (a probe every interval) falls
// due again; once handed out it is no longer scheduled.
func TestScheduledAgainAfterFallingDue(t *testing.T) {
	q, clk := started(t)
	for i := range 3 {
		q.Schedule("a", clk.Now().Add(time.Second))
		clk.Step(time.Second)
		if k := get(t, q); k != "a" {
			t.Fatalf("round %d: key %q, want a", i, k)
		}
		if _, ok := q.Scheduled("a"); ok {
			t.Fatalf("round %d: a is still scheduled once handed out", i)
		}
		q.Done("a")
	}
	q.Schedule("a", time.Time{}) // forgotten
	q.mu.Lock()
	n := len(q.scheduled)
	q.mu.Unlock()
	if n != 0 {
		t.Errorf("%d keys kept after the last was unscheduled", n)
	}
}
