package unaryconn

import (
	"errors"
	"sync"
)

// Poller watches idle connections (Conn.Watch) for whoever holds them, and
// owns every goroutine that watching takes: Close ends the watches still
// under way and returns once all those goroutines have.
//
// On Linux the watched sockets wait together in one epoll set, on one
// goroutine: a goroutine blocked in a read of each would cost its 2 KiB
// stack and 0.5 KiB of runtime state, 12 MiB at 5,000 plugins, a quarter of
// plugd's memory there. When a socket is readable, a goroutine that lasts
// as long as reading what came takes a turn, and arms the socket again
// (EPOLLONESHOT: one turn at a time). The epoll set is itself waited on by
// Go's netpoller, like any socket; it is made with the first watch and
// closed with the last, so that an idle Poller holds nothing. Elsewhere (or
// with PollerOptions.Goroutines) each watch is a goroutine blocked in a
// read of at most one frame.
//
// What that costs a connection (bench/cmd/heldconns measures both;
// bench/README.md has the figures): in the epoll set about 0.1 KiB; with a
// goroutine its smallest stack (2 KiB) and about 1 KiB of heap, 3 KiB of
// resident memory each at 5,000 connections.
//
// Make one with NewPoller. Its methods are safe for concurrent use.
type Poller struct {
	goroutines bool // PollerOptions.Goroutines

	mu      sync.Mutex
	closed  bool
	watches map[int32]*watch // every watch under way, by id (its key in the epoll set)
	next    int32
	set     *epollSet      // the epoll set while it holds a socket, else nil (Linux)
	running sync.WaitGroup // every goroutine the Poller started

	// Tests' hooks, set before the first watch: hookRead is called after
	// each read of a watch, hookPoll where the set's goroutine has events
	// in hand ("start") and before the set is closed ("close").
	hookRead func(n int)
	hookPoll func(where string)
}

// PollerOptions say how a Poller watches. The zero value is the default.
type PollerOptions struct {
	// Goroutines makes every watch a goroutine blocked in a read of its
	// socket, as on platforms without epoll, even on Linux. It is for
	// comparing the two: the tests run both, bench/cmd/heldconns measures
	// both. Off (the default), the watched sockets wait in one epoll set on
	// Linux, and a goroutine each elsewhere.
	Goroutines bool
}

// ErrPollerClosed is Watch's error once the Poller is closed.
var ErrPollerClosed = errors.New("unaryconn: the poller is closed")

// NewPoller returns a Poller. Nothing runs until the first watch.
func NewPoller(opts PollerOptions) *Poller {
	return &Poller{goroutines: opts.Goroutines, watches: make(map[int32]*watch)}
}

// Close ends every watch under way (its connection stays open, unwatched,
// and its onHangup is not called), makes every later Watch with p fail, and
// returns once every goroutine p started has returned, onHangup calls
// included: it must not be called from onHangup. It may be called more than
// once.
func (p *Poller) Close() {
	p.mu.Lock()
	p.closed = true
	ws := make([]*watch, 0, len(p.watches))
	for _, w := range p.watches {
		ws = append(ws, w)
	}
	p.mu.Unlock()
	for _, w := range ws {
		c := w.c
		c.mu.Lock()
		if c.w == w {
			c.stopWatchLocked()
			if c.poller == p {
				c.onHangup = nil // no watch resumes after a call in flight
			}
		}
		c.mu.Unlock()
	}
	p.running.Wait()
}

// add starts w: in the epoll set where there is one, else on a goroutine.
// w.c.mu must be held.
func (p *Poller) add(w *watch) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return ErrPollerClosed
	}
	for p.next++; p.next == 0 || p.watches[p.next] != nil; p.next++ {
	}
	w.id = p.next
	p.watches[w.id] = w
	if !p.goroutines && p.pollLocked(w) == nil {
		if len(w.c.rest) > 0 {
			// What the last call read past its answer will not make the
			// socket readable.
			p.goLocked(func() { w.c.pollStep(w) })
		}
		return nil
	}
	// No epoll set (not Linux, none could be made, or not wanted).
	w.done = make(chan struct{})
	p.goLocked(func() { w.c.watch(w) })
	return nil
}

// remove takes w out of p, and its socket out of the epoll set. w.c.mu must
// be held.
func (p *Poller) remove(w *watch) {
	if w.set != nil {
		p.unpoll(w)
	}
	p.mu.Lock()
	if p.watches[w.id] == w {
		delete(p.watches, w.id)
	}
	p.mu.Unlock()
}

// goLocked runs f on a goroutine that Close waits for. p.mu must be held:
// Close, which marks p closed under it, waits only once nothing more can be
// started but by goroutines it waits for.
func (p *Poller) goLocked(f func()) {
	p.running.Add(1)
	go func() {
		defer p.running.Done()
		f()
	}()
}
