package pluginmanager_test

import (
	"io"
	"net"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

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
			l, err := net.Listen("unix", path)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { l.Close() })
			var conns atomic.Int32
			go func() {
				for {
					c, err := l.Accept()
					if err != nil {
						return
					}
					conns.Add(1)
					go func() { defer c.Close(); tc.serve(c) }()
				}
			}()
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
