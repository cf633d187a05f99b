package pluginmanager_test

import (
	"io"
	"net"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"golang.org/x/net/http2"

	"github.com/plugd/plugd/pluginmanager"
	"github.com/plugd/plugd/plugintest"
)

// TestNotHTTP2IsADialFailure: a socket whose server accepts and then hangs
// up without a word, or answers as something other than HTTP/2, fails to
// connect (ReasonDial), though the manager's first call went with its
// connection's preface: the server acted on nothing. Each attempt connects
// once: it is not a GetInfo the server hung up on, asked again at once.
func TestNotHTTP2IsADialFailure(t *testing.T) {
	for _, tc := range []struct {
		name  string
		serve func(net.Conn)
		says  string
	}{{
		name:  "hangs up",
		serve: func(c net.Conn) { c.(*net.UnixConn).CloseWrite(); io.Copy(io.Discard, c) },
		says:  "without a word",
	}, {
		name: "HTTP/1.1",
		serve: func(c net.Conn) {
			c.Write([]byte("HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"))
			io.Copy(io.Discard, c)
		},
		says: "not an HTTP/2 server",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			h := start(t, pluginmanager.Options{}, map[string]pluginmanager.Handler{"CSIPlugin": plugintest.NewRecorder()})
			path := filepath.Join(h.dir, "odd.sock")
			conns := serveConns(t, path, func(_ *net.UnixListener, _ int32, c net.Conn) { tc.serve(c) })
			ev := h.WaitEvent(path, pluginmanager.EventFailed)
			if ev.Reason != pluginmanager.ReasonDial || !strings.Contains(ev.Error, "HTTP/2 handshake") || !strings.Contains(ev.Error, tc.says) || ev.Attempt != 1 {
				t.Errorf("failure: %s %q (attempt %d), want a dial failure that says the handshake failed and %q", ev.Reason, ev.Error, ev.Attempt, tc.says)
			}
			if n := conns.Load(); n != 1 {
				t.Errorf("the first attempt connected %d times, want once", n)
			}
		})
	}
}

// TestRetriedGetInfoThatCannotConnectIsADialFailure: a server that answers
// the handshake, then says with GOAWAY that it did not take GetInfo, is
// asked again at once on a new connection. When that connection cannot be
// made (nothing listens any more), or its handshake fails (the server hangs
// up without a word), the attempt failed to connect (ReasonDial), as a
// first connection that failed so does: it is not GetInfo that failed. A
// socket nobody listens on is then Stale, once the grace a socket that has
// just appeared gets to start listening has passed (about 2 s).
func TestRetriedGetInfoThatCannotConnectIsADialFailure(t *testing.T) {
	for _, tc := range []struct {
		name string
		// second: what the server does with the second connection; nil:
		// the listener is closed before the first is answered.
		second func(net.Conn)
		says   string
		state  pluginmanager.State
	}{{
		name:  "nothing listens",
		says:  "connection refused",
		state: pluginmanager.StateStale,
	}, {
		name:   "hangs up",
		second: func(c net.Conn) { c.(*net.UnixConn).CloseWrite(); io.Copy(io.Discard, c) },
		says:   "HTTP/2 handshake",
		state:  pluginmanager.StateFailed,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			h := start(t, pluginmanager.Options{}, map[string]pluginmanager.Handler{"CSIPlugin": plugintest.NewRecorder()})
			path := filepath.Join(h.dir, "going.sock")
			conns := serveConns(t, path, func(l *net.UnixListener, n int32, c net.Conn) {
				if n > 1 {
					tc.second(c)
					return
				}
				if tc.second == nil {
					l.Close() // before the GOAWAY that has the manager connect again
				}
				fr := http2.NewFramer(c, c)
				fr.WriteSettings()
				fr.WriteGoAway(0, http2.ErrCodeNo, []byte("shutting down")) // stream 1 not taken
				c.(*net.UnixConn).CloseWrite()
				io.Copy(io.Discard, c)
			})
			ev := h.WaitEvent(path, pluginmanager.EventFailed)
			if ev.Reason != pluginmanager.ReasonDial || !strings.Contains(ev.Error, tc.says) || ev.Attempt != 1 || ev.State != tc.state {
				t.Errorf("failure: %s %s %q (attempt %d), want %s, a dial failure that says %q", ev.State, ev.Reason, ev.Error, ev.Attempt, tc.state, tc.says)
			}
			want := int32(2)
			if tc.second == nil {
				want = 1
			}
			if n := conns.Load(); n != want {
				t.Errorf("the first attempt was accepted %d times, want %d", n, want)
			}
		})
	}
}

// serveConns listens at path and serves each connection it accepts with
// serve(l, n, c), l the listener (which leaves the socket file in place when
// closed: nobody listens, the file is not gone) and n counting the
// connections from 1, in a goroutine of its own that closes c after. It
// returns the count. The listener is closed when the test ends.
func serveConns(t *testing.T, path string, serve func(l *net.UnixListener, n int32, c net.Conn)) *atomic.Int32 {
	t.Helper()
	nl, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	l := nl.(*net.UnixListener)
	l.SetUnlinkOnClose(false)
	t.Cleanup(func() { l.Close() })
	var conns atomic.Int32
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			n := conns.Add(1)
			go func() { defer c.Close(); serve(l, n, c) }()
		}
	}()
	return &conns
}
