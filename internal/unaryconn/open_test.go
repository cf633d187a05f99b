package unaryconn

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc/codes"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/plugd/plugd/internal/testenv"
)

// open connects to path and starts a connection with Open, whose handshake
// must end by handshake from now (none if 0); it is closed when the test
// ends.
func open(tb testing.TB, path string, handshake time.Duration) *Conn {
	tb.Helper()
	nc, err := net.Dial("unix", path)
	if err != nil {
		tb.Fatal(err)
	}
	var by time.Time
	if handshake > 0 {
		by = time.Now().Add(handshake)
	}
	c := Open(nc.(*net.UnixConn), by)
	tb.Cleanup(func() { c.Close() })
	return c
}

// TestOpenPipelines: a connection from Open sends its first request with its
// preface, before the peer has said anything (a peer that waits for the
// request to send its SETTINGS is answered), and the acknowledgements owed
// go with the next request: the SETTINGS ACK before its HEADERS, the PING
// ACK after its DATA.
func TestOpenPipelines(t *testing.T) {
	order := make(chan []string, 1)
	path := rawPeer(t, func(p *peer) {
		s := p.readRequest(getInfo, true) // before a word of ours
		p.hello()
		p.check(p.fr.WritePing(false, [8]byte{'b', 'd', 'p'}))
		p.answer(s, peerInfo)
		var got []string
		for len(got) < 4 {
			switch f := p.readFrame().(type) {
			case *http2.SettingsFrame:
				got = append(got, "SETTINGS ACK")
			case *http2.PingFrame:
				got = append(got, "PING ACK")
			case *http2.MetaHeadersFrame:
				got = append(got, "HEADERS")
			case *http2.DataFrame:
				got = append(got, "DATA")
				if f.StreamEnded() {
					p.answer(f.StreamID, &registerapi.RegistrationStatusResponse{})
				}
			}
		}
		order <- got
		p.drain()
	})
	c := open(t, path, testenv.Timeout)
	c.ackDelay = time.Hour // what is owed waits for the next call: what goes with what is certain
	got, err := info(c, testenv.Timeout, 1<<16)
	if err != nil {
		t.Fatal(err)
	}
	if got.Name != peerInfo.Name {
		t.Errorf("GetInfo answered %v", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout)
	defer cancel()
	if err := c.Invoke(ctx, notify, &registerapi.RegistrationStatus{PluginRegistered: true}, &registerapi.RegistrationStatusResponse{}, 1<<16); err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(recv(t, order), ", "), "SETTINGS ACK, HEADERS, DATA, PING ACK"; got != want {
		t.Errorf("the second request came as %s, want %s", got, want)
	}
}

// TestOpenAcksAlone: acknowledgements owed do not wait long for a call to go
// with: a peer that waits for them before it answers is answered (they go
// while the call waits), and so is one that PINGs after the answer, when no
// call follows.
func TestOpenAcksAlone(t *testing.T) {
	acked := make(chan string, 1)
	path := rawPeer(t, func(p *peer) {
		s := p.readRequest(getInfo, true)
		p.hello()
		p.check(p.fr.WritePing(false, [8]byte{'f', 'i', 'r', 's', 't'}))
		if got := p.readPing(); got != "ack true first" {
			p.fatalf("got %s, want the ACK of the first PING", got)
		}
		if p.acks == 0 {
			p.fatalf("the PING ACK came before the SETTINGS ACK")
		}
		p.answerWithPing(s, peerInfo, [8]byte{'a', 'f', 't', 'e', 'r'})
		acked <- p.readPing()
		p.drain()
	})
	c := open(t, path, testenv.Timeout)
	if _, err := info(c, testenv.Timeout, 1<<16); err != nil {
		t.Fatal(err)
	}
	if got := recv(t, acked); got != "ack true after" {
		t.Errorf("the peer got %q, want the ACK of the PING after the answer", got)
	}
}

// TestOpenHostile: the first call on a connection from Open, to a peer that
// is not an HTTP/2 server, fails as NewConn would (ErrHandshake, with what
// the peer did), and never as maybe delivered: it acted on nothing.
func TestOpenHostile(t *testing.T) {
	for _, tc := range []struct {
		name      string
		handshake time.Duration // Open's handshake deadline; 0 is none
		timeout   time.Duration // the call's
		script    func(p *peer)
		kinds     []string
		says      string
	}{{
		name:      "silent",
		handshake: 200 * time.Millisecond,
		timeout:   testenv.Timeout,
		script:    func(p *peer) { p.drain() },
		kinds:     []string{"DeadlineExceeded", "ErrHandshake", "ErrMaybeDelivered"}, // it has the request, and may yet read it
		says:      "no SETTINGS by the handshake's deadline",
	}, {
		name:    "silent, no handshake deadline",
		timeout: 200 * time.Millisecond,
		script:  func(p *peer) { p.drain() },
		kinds:   []string{"DeadlineExceeded", "ErrHandshake", "ErrMaybeDelivered"},
		says:    "deadline",
	}, {
		name: "hangs up",
		script: func(p *peer) {
			p.readRequest(getInfo, true)
			p.check(p.nc.(*net.UnixConn).CloseWrite())
			p.drain()
		},
		kinds: []string{"ErrHangup", "ErrHandshake"},
		says:  "without a word",
	}, {
		name: "garbage",
		script: func(p *peer) {
			p.readRequest(getInfo, true)
			_, err := p.nc.Write([]byte("HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"))
			p.check(err)
			p.drain()
		},
		kinds: []string{"ErrProtocol", "ErrHandshake"},
		says:  "not an HTTP/2 server",
	}, {
		name: "PING first",
		script: func(p *peer) {
			p.check(p.fr.WritePing(false, [8]byte{}))
			p.drain()
		},
		kinds: []string{"ErrProtocol", "ErrHandshake"},
		says:  "not an HTTP/2 server",
	}, {
		name: "answer first",
		script: func(p *peer) {
			// Only the answer's first frame: the client hangs up on it,
			// and the rest, written after, could fail the script (EPIPE).
			p.headers(p.readRequest(getInfo, true), false, okHeaders...)
			p.drain()
		},
		kinds: []string{"ErrProtocol", "ErrHandshake"},
		says:  "not SETTINGS",
	}, {
		name: "invalid SETTINGS",
		script: func(p *peer) {
			p.hello(http2.Setting{ID: http2.SettingMaxFrameSize, Val: 0})
			p.drain()
		},
		kinds: []string{"ErrProtocol", "ErrHandshake"},
		says:  "bad SETTINGS",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			c := open(t, rawPeer(t, tc.script), tc.handshake)
			timeout := cmp(tc.timeout, testenv.Timeout)
			_, err := info(c, timeout, 1<<16)
			elapsed := time.Since(start)
			if err == nil {
				t.Fatal("the call succeeded")
			}
			wantKinds(t, err, tc.kinds...)
			if !strings.Contains(err.Error(), "HTTP/2 handshake: ") || !strings.Contains(err.Error(), tc.says) {
				t.Errorf("%v does not say it was the handshake, and %q", err, tc.says)
			}
			if limit := cmp(tc.handshake, tc.timeout); limit > 0 && elapsed < limit {
				t.Errorf("failed after %v, before the deadline of %v", elapsed, limit)
			}
			if tc.handshake > 0 && elapsed >= timeout {
				t.Errorf("failed after %v, at the call's deadline, not the handshake's", elapsed)
			}
			if c.Usable() {
				t.Error("usable after the handshake failed")
			}
			_, err = info(c, testenv.Timeout, 1<<16)
			wantCode(t, err, codes.Unavailable)
			if errors.Is(err, ErrMaybeDelivered) {
				t.Errorf("a later call: %v", err)
			}
			c.Close() // which ends the script's drain
		})
	}
}

// cmp is a if it is not 0, else b.
func cmp(a, b time.Duration) time.Duration {
	if a != 0 {
		return a
	}
	return b
}

// TestOpenRefusedStream: a peer that allows no stream
// (SETTINGS_MAX_CONCURRENT_STREAMS 0) refuses the one sent with the preface,
// before its SETTINGS could be read; the request goes again, once the peer
// allows a stream, on a new one: it was not processed.
func TestOpenRefusedStream(t *testing.T) {
	streams := make(chan uint32, 1)
	path := rawPeer(t, func(p *peer) {
		p.hello(http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: 0})
		s := p.readRequest(getInfo, true)
		p.check(p.fr.WriteRSTStream(s, http2.ErrCodeRefusedStream))
		p.check(p.fr.WritePing(false, [8]byte{'r', 'a', 'i', 's', 'e'}))
		if got := p.readPing(); got != "ack true raise" { // while the call waits for a stream
			p.fatalf("got %s, want the ACK of the PING", got)
		}
		if p.acks == 0 {
			p.fatalf("the PING ACK came before the SETTINGS ACK")
		}
		p.hello(http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: 1})
		again := p.readRequest(getInfo, true)
		streams <- again
		p.answer(again, peerInfo)
		p.drain()
	})
	c := open(t, path, testenv.Timeout)
	if _, err := info(c, testenv.Timeout, 1<<16); err != nil {
		t.Fatal(err)
	}
	if s := recv(t, streams); s != 3 {
		t.Errorf("sent again on stream %d, want 3", s)
	}

	// Refused again, once the limit was known: the peer's answer, and
	// the stream is not sent a third time; nor is a later call's, sent
	// once the limit was known, sent twice.
	refused := make(chan uint32, 3)
	c = open(t, rawPeer(t, func(p *peer) {
		p.hello(http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: 1})
		for range 3 {
			s := p.readRequest(getInfo, true)
			refused <- s
			p.check(p.fr.WriteRSTStream(s, http2.ErrCodeRefusedStream))
		}
		p.drain()
	}), testenv.Timeout)
	for i := range 2 {
		_, err := info(c, testenv.Timeout, 1<<16)
		wantCode(t, err, codes.Unavailable)
		wantKinds(t, err)
		if !strings.Contains(err.Error(), "REFUSED_STREAM") {
			t.Errorf("call %d: %v", i, err)
		}
	}
	for _, want := range []uint32{1, 3, 5} {
		if got := recv(t, refused); got != want {
			t.Errorf("refused stream %d, want %d", got, want)
		}
	}
}

// TestOpenGoAwayBeforeStream: a peer that answers the preface with SETTINGS
// and a GOAWAY that does not cover the stream sent with it (a server
// shutting down) did not process it: a hang-up, not maybe delivered, and not
// the handshake's failure.
func TestOpenGoAwayBeforeStream(t *testing.T) {
	c := open(t, rawPeer(t, func(p *peer) {
		p.hello()
		p.readRequest(getInfo, true)
		p.check(p.fr.WriteGoAway(0, http2.ErrCodeNo, []byte("shutting down")))
		p.drain()
	}), testenv.Timeout)
	_, err := info(c, testenv.Timeout, 1<<16)
	wantCode(t, err, codes.Unavailable)
	wantKinds(t, err, "ErrHangup")
}

// TestOpenGRPCGo: a connection from Open carries calls to grpc-go's server.
func TestOpenGRPCGo(t *testing.T) {
	c := open(t, serve(t, registration{}), testenv.Timeout)
	for i := range 3 {
		if _, err := info(c, testenv.Timeout, 1<<16); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
}

// TestOpenWatchedFirst: a connection from Open watched before its first call
// sends its preface then, acknowledges the peer's SETTINGS after it, and
// carries a call later; one whose peer's first frame is not SETTINGS is
// hung up on as not HTTP/2.
func TestOpenWatchedFirst(t *testing.T) { eachWatch(t, testOpenWatchedFirst) }

func testOpenWatchedFirst(t *testing.T, pl *Poller) {
	acked := make(chan bool, 1)
	c := open(t, rawPeer(t, func(p *peer) {
		p.readPreface()
		p.hello()
		p.readUntil(func(f http2.Frame) bool { sf, ok := f.(*http2.SettingsFrame); return ok && sf.IsAck() })
		acked <- true
		p.answer(p.readRequest(getInfo, true), peerInfo)
		p.drain()
	}), testenv.Timeout)
	hung := watched(t, pl, c)
	recv(t, acked)
	if _, err := info(c, testenv.Timeout, 1<<16); err != nil {
		t.Fatal(err)
	}
	noHangup(t, hung)

	c = open(t, rawPeer(t, func(p *peer) {
		p.readPreface()
		p.check(p.fr.WritePing(false, [8]byte{}))
		p.drain()
	}), testenv.Timeout)
	err := recv(t, watched(t, pl, c))
	if !errors.Is(err, ErrProtocol) || !errors.Is(err, ErrHandshake) {
		t.Errorf("hang-up %v, want ErrProtocol and ErrHandshake", err)
	}
}
