package unaryconn

import (
	"errors"
	"runtime"
	"strings"
	"testing"
)

// TestWatchInOneEpollSet: on Linux, watched connections wait together in
// the process's epoll set, not on a goroutine each; each one's hang-up is
// still told; the set goes with the last watch.
func TestWatchInOneEpollSet(t *testing.T) {
	const n = 100
	srv, path := newServer(t, registration{})
	t.Cleanup(srv.Stop)
	hung := make(chan error, n)
	for range n {
		c := dial(t, path)
		if _, err := info(c, wait, 1<<16); err != nil {
			t.Fatal(err)
		}
		if err := c.Watch(func(err error) { hung <- err }); err != nil {
			t.Fatal(err)
		}
	}
	polls.mu.Lock()
	in := 0
	if polls.p != nil {
		in = len(polls.p.watches)
	}
	polls.mu.Unlock()
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
	polls.mu.Lock()
	left := polls.p
	polls.mu.Unlock()
	if left != nil {
		t.Errorf("the epoll set outlived its watches (%d left)", len(left.watches))
	}
}
