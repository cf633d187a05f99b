package backoff

import (
	"testing"
	"time"
)

func TestDoublesUpToTheCap(t *testing.T) {
	b := New(100*time.Millisecond, time.Second, 0)
	var got []time.Duration
	for range 6 {
		got = append(got, b.Next())
	}
	want := []time.Duration{100, 200, 400, 800, 1000, 1000}
	for i := range want {
		if got[i] != want[i]*time.Millisecond {
			t.Fatalf("delays %v, want %v ms", got, want)
		}
	}
	b.Reset()
	if d := b.Next(); d != 100*time.Millisecond {
		t.Errorf("after Reset: %s, want the initial 100ms", d)
	}
}

func TestJitterStaysAroundTheStepAndUnderTheCap(t *testing.T) {
	for range 1000 {
		b := New(100*time.Millisecond, 400*time.Millisecond, 0.2)
		for i, step := range []time.Duration{100, 200, 400, 400} {
			step *= time.Millisecond
			d := b.Next()
			lo, hi := time.Duration(float64(step)*0.8), min(time.Duration(float64(step)*1.2), 400*time.Millisecond)
			if d < lo || d > hi {
				t.Fatalf("delay %d = %s, want within [%s, %s]", i, d, lo, hi)
			}
		}
	}
}

func TestZeroWaitsNoTime(t *testing.T) {
	var b Backoff
	if d := b.Next(); d != 0 {
		t.Errorf("zero Backoff waits %s", d)
	}
}
