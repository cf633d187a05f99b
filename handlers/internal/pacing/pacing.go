// Package pacing bounds the work a plugin's stream can make a handler do.
//
// A device plugin's ListAndWatch and a DRA driver's health stream send
// whatever the plugin likes, as often as it likes: 10,000 devices 160 times a
// second held plugd at 88% of a core. A Pacer lets a stream through at a
// number of bytes a second, with a burst; a handler waits on it before it
// receives the next message, so that gRPC's flow control holds a faster
// plugin back in its own Send, and plugd decodes no more than the pace.
package pacing

import (
	"context"

	"golang.org/x/time/rate"
	"k8s.io/utils/clock"
)

// Pacer is the pace of one stream. It is not safe for concurrent use: one
// goroutine receives a stream.
type Pacer struct {
	lim     *rate.Limiter
	clk     clock.Clock
	burst   int
	minCost int
}

// New returns a pacer of bytesPerSecond, that lets burst bytes through at
// once, and counts every message as at least minCost bytes (so that a flood
// of tiny messages is paced too). Nil clk means the real clock.
func New(clk clock.Clock, bytesPerSecond, burst, minCost int) *Pacer {
	if clk == nil {
		clk = clock.RealClock{}
	}
	return &Pacer{lim: rate.NewLimiter(rate.Limit(bytesPerSecond), burst), clk: clk, burst: burst, minCost: minCost}
}

// Wait counts a message of size bytes, and returns once the stream may take
// the next one: at once while the stream is within its pace, after the delay
// that brings it back otherwise, or when ctx is done (then with its error).
// It reports whether it had to wait.
func (p *Pacer) Wait(ctx context.Context, size int) (waited bool, err error) {
	now := p.clk.Now()
	delay := p.lim.ReserveN(now, min(max(size, p.minCost), p.burst)).DelayFrom(now)
	if delay <= 0 {
		return false, nil
	}
	t := p.clk.NewTimer(delay)
	defer t.Stop()
	select {
	case <-t.C():
		return true, nil
	case <-ctx.Done():
		return true, ctx.Err()
	}
}
