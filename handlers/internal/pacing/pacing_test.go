package pacing

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/plugd/plugd/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// A stream within its burst goes at once; past it, it waits until the pace
// allows the next message, on the clock it was given.
func TestPacer(t *testing.T) {
	clk := testenv.NewTimerClock()
	p := New(clk, 1000, 3000, 100)
	ctx := context.Background()
	for _, size := range []int{1000, 1000, 10, 900} { // 10 counts as 100: 3000 in all
		if waited, err := p.Wait(ctx, size); waited || err != nil {
			t.Fatalf("within the burst: waited %v, %v", waited, err)
		}
	}
	done := make(chan bool)
	go func() {
		waited, _ := p.Wait(ctx, 500) // half a second in debt
		done <- waited
	}()
	if d := <-clk.Timers; d != 500*time.Millisecond {
		t.Errorf("waits %s, want 500ms", d)
	}
	select {
	case <-done:
		t.Fatal("past the burst, Wait returned before the clock moved")
	default:
	}
	clk.Step(500 * time.Millisecond)
	if waited := <-done; !waited {
		t.Error("Wait did not say it waited")
	}

	// A cancelled wait ends at once.
	ctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := p.Wait(ctx, 3000); err == nil {
		t.Error("a cancelled Wait returned no error")
	}
}
