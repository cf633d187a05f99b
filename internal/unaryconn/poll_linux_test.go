package unaryconn

import (
	"errors"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/plugd/plugd/internal/testenv"
)

// TestWatchInOneEpollSet: on Linux, a Poller's watched connections wait
// together in its epoll set, not on a goroutine each; each one's hang-up is
// still told; the set goes with the last watch.
func TestWatchInOneEpollSet(t *testing.T) {
	const n = 100
	pl := newPoller(t, false)
	srv, path := newServer(t, registration{})
	t.Cleanup(srv.Stop)
	hung := make(chan error, n)
	for range n {
		c := dial(t, path)
		if _, err := info(c, testenv.Timeout, 1<<16); err != nil {
			t.Fatal(err)
		}
		if err := c.Watch(pl, func(err error) { hung <- err }); err != nil {
			t.Fatal(err)
		}
	}
	pl.mu.Lock()
	in := 0
	if pl.set != nil {
		in = pl.set.polled
	}
	pl.mu.Unlock()
	if in != n {
		t.Errorf("%d connections in the epoll set, want all %d", in, n)
	}
	buf := make([]byte, 1<<20)
	stacks := string(buf[:runtime.Stack(buf, true)])
	if k := strings.Count(stacks, "unaryconn.(*Conn).watch("); k > 0 {
		t.Errorf("%d goroutines watching a connection each, want none", k)
	}

	srv.Stop()
	for range n {
		if err := recv(t, hung); !errors.Is(err, ErrHangup) {
			t.Errorf("hang-up %v, want ErrHangup", err)
		}
	}
	pl.mu.Lock()
	left, watches := pl.set, len(pl.watches)
	pl.mu.Unlock()
	if left != nil || watches != 0 {
		t.Errorf("the epoll set outlived its watches (%d left)", watches)
	}
}

// TestWatchLastEndsWhileEventsInHand: the last watch may end while the
// set's goroutine has events in hand, for which it is about to take the
// Poller's lock: the set is then closed without that lock held, or neither
// would go on (review of the change: TestWatchCalls hung in 3 runs of 6).
func TestWatchLastEndsWhileEventsInHand(t *testing.T) {
	inHand, release, closing := make(chan struct{}), make(chan struct{}), make(chan struct{})
	var handOnce, closeOnce sync.Once
	pl := newPoller(t, false)
	pl.hookPoll = func(where string) {
		switch where {
		case "start":
			handOnce.Do(func() { close(inHand); <-release })
		case "close":
			closeOnce.Do(func() { close(closing) })
		}
	}

	ping := make(chan struct{})
	path := rawPeer(t, func(p *peer) {
		p.hello()
		p.answer(p.readRequest(getInfo, true), peerInfo)
		<-ping
		p.check(p.fr.WritePing(false, [8]byte{'p'}))
		p.drain()
	})
	c := dial(t, path)
	if _, err := info(c, testenv.Timeout, 1<<16); err != nil {
		t.Fatal(err)
	}
	watched(t, pl, c)
	close(ping)
	recv(t, inHand) // the PING's event
	closed := make(chan error, 1)
	go func() { closed <- c.Close() }()
	recv(t, closing) // the last watch ended; the set is being closed
	close(release)
	if err := recv(t, closed); err != nil {
		t.Errorf("Close: %v", err)
	}
}
