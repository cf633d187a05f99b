//go:build unix

package unaryconn

// A call on a connection the server has sent GOAWAY to, found by polling
// the socket (unix only).

import (
	"errors"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	"github.com/plugd/plugd/internal/testenv"
)

// TestServerGracefulStop makes a call after the server sent GOAWAY to an idle
// connection. grpc-go's first GOAWAY is a warning that still lets streams
// begin (the last stream ID is the largest), so the call may be answered;
// either way the connection is then unusable and nothing hangs.
func TestServerGracefulStop(t *testing.T) {
	srv, path := newServer(t, registration{})
	t.Cleanup(srv.Stop)
	c := dial(t, path)
	if _, err := info(c, testenv.Timeout, 1<<16); err != nil {
		t.Fatal(err)
	}
	stopped := make(chan struct{})
	go func() {
		srv.GracefulStop()
		close(stopped)
	}()
	waitReadable(t, c)

	_, err := info(c, testenv.Timeout, 1<<16)
	t.Logf("the call after GOAWAY: %v", err)
	if err != nil {
		wantCode(t, err, codes.Unavailable) // not DeadlineExceeded: it did not wait
	}
	if c.Usable() {
		t.Error("the connection is usable after GOAWAY")
	}
	_, err = info(c, testenv.Timeout, 1<<16)
	wantCode(t, err, codes.Unavailable)

	c.Close()
	recv(t, stopped)
}

// waitReadable waits until the peer has sent c something: GOAWAY, here.
func waitReadable(t *testing.T, c *Conn) {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var n int
	err = rc.Control(func(fd uintptr) {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		for {
			n, err = unix.Poll(fds, int(testenv.Timeout/time.Millisecond))
			if !errors.Is(err, unix.EINTR) {
				return
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		t.Fatal("timed out waiting for the server's GOAWAY")
	}
}
