package unaryconn

import (
	"context"
	"net"
	"sync"
	"time"
)

// deadlineSkew is how far ahead of our deadline a peer's reset of the stream
// is taken for the peer enforcing that deadline.
const deadlineSkew = 50 * time.Millisecond

// idleWriteTimeout bounds the answers to the peer that an idle connection
// owes it (PING and SETTINGS acknowledgements).
const idleWriteTimeout = 100 * time.Millisecond

// aLongTimeAgo is a deadline that makes a blocked read or write return now.
var aLongTimeAgo = time.Unix(1, 0)

// cutter makes the end of a context cut short a read or write on the socket
// until it is stopped. stop waits for a cut already begun, which
// context.AfterFunc's stop does not: left running, the cut could set its
// deadline after the next call set its own, and fail that call.
type cutter struct {
	nc       *net.UnixConn
	stopFunc func() bool // context.AfterFunc's; nil for a context that never ends early

	mu      sync.Mutex
	stopped bool
}

// start cuts nc short at the end of ctx, until stop.
func (k *cutter) start(ctx context.Context, nc *net.UnixConn) {
	if ctx.Done() == nil {
		return // it never ends: nothing to cut
	}
	k.nc = nc
	k.stopFunc = context.AfterFunc(ctx, k.cut)
}

func (k *cutter) cut() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if !k.stopped {
		k.nc.SetDeadline(aLongTimeAgo)
	}
}

// stop ends what start began, once a cut begun has ended.
func (k *cutter) stop() {
	if k.stopFunc != nil && !k.stopFunc() {
		k.mu.Lock() // the cut has begun: it is done, or will do nothing
		k.stopped = true
		k.mu.Unlock()
	}
}
