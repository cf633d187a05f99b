package dra

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	drahealthv1 "k8s.io/kubelet/pkg/apis/dra-health/v1"

	"github.com/plugd/plugd/handlers/internal/pacing"
	"github.com/plugd/plugd/internal/testenv"
)

// floodStream is a health stream that has a report ready at every Recv.
type floodStream struct {
	grpc.ClientStream // not called
	ctx               context.Context
	resp              *drahealthv1.NodeWatchResourcesResponse
	received          atomic.Int64
	enough            int64
	many              chan struct{} // closed at enough
}

func (s *floodStream) Recv() (*drahealthv1.NodeWatchResourcesResponse, error) {
	if err := s.ctx.Err(); err != nil {
		return nil, err
	}
	if s.received.Add(1) == s.enough {
		close(s.many)
	}
	return s.resp, nil
}

type floodClient struct{ s *floodStream }

func (c floodClient) NodeWatchResources(ctx context.Context, _ *drahealthv1.NodeWatchResourcesRequest, _ ...grpc.CallOption) (grpc.ServerStreamingClient[drahealthv1.NodeWatchResourcesResponse], error) {
	c.s.ctx = ctx
	return c.s, nil
}

// Issue 13, item 5: a DRA driver that floods its health stream is slowed to
// the pace (512 KiB of reports a second, 1 MiB at once): the handler takes
// a burst, then waits before it receives the next report, and each step of
// the clock over the wait lets one more through.
func TestHealthFloodIsPaced(t *testing.T) {
	clk := testenv.NewTimerClock()
	h := New(Options{Clock: clk})
	_, in := handMade(h)
	s := &floodStream{resp: healthReport("pool", "gpu", maxDevices, drahealthv1.HealthStatus_HEALTHY), enough: 10_000, many: make(chan struct{})}
	size := proto.Size(s.resp)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.healthStream(ctx, h.instanceHealth(in), floodClient{s}, pacing.New(clk, healthBytesPerSecond, healthBurst, minHealthCost))
	}()
	defer func() { cancel(); <-done }()

	var d time.Duration
	select {
	case d = <-clk.Timers:
	case <-s.many:
		t.Fatalf("the handler took %d reports of %d KiB without slowing the stream", s.enough, size>>10)
	case <-time.After(testenv.Timeout):
		t.Fatalf("the handler neither slowed the stream nor took %d reports within %s", s.enough, testenv.Timeout)
	}
	taken := s.received.Load()
	if most := int64(healthBurst/size + 2); taken > most {
		t.Errorf("the handler took %d reports of %d KiB at once, more than the burst of 1 MiB allows (%d)", taken, size>>10, most)
	}
	for range 3 {
		before := taken
		clk.Step(d)
		select {
		case d = <-clk.Timers:
		case <-time.After(testenv.Timeout):
			t.Fatalf("the handler did not wait again after report %d", s.received.Load())
		}
		if taken = s.received.Load(); taken != before+1 {
			t.Errorf("a step of the clock took the handler from report %d to report %d", before, taken)
		}
	}
	t.Logf("reports of %d KiB: the handler took %d", size>>10, taken)
}
