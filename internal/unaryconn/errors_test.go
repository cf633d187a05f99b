package unaryconn

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/plugd/plugd/internal/testenv"
)

// kinds are the sentinels a caller branches on.
var kinds = map[string]error{
	"ErrProtocol":       ErrProtocol,
	"ErrHangup":         ErrHangup,
	"ErrMaybeDelivered": ErrMaybeDelivered,
	"ErrFlood":          ErrFlood,
	"ErrHandshake":      ErrHandshake,
	"DeadlineExceeded":  context.DeadlineExceeded,
}

// wantKinds fails the test unless err matches exactly the named sentinels
// of kinds.
func wantKinds(tb testing.TB, err error, want ...string) {
	tb.Helper()
	for name, kind := range kinds {
		wanted := false
		for _, w := range want {
			wanted = wanted || w == name
		}
		if errors.Is(err, kind) != wanted {
			tb.Errorf("errors.Is(%v, %s) = %v, want %v", err, name, !wanted, wanted)
		}
	}
}

// TestErrorKinds: what a call's error matches tells the caller what to do:
// fall back to grpc-go (ErrProtocol), dial again (ErrHangup), not resend
// (ErrMaybeDelivered), or take the plugin's answer as it is (none).
func TestErrorKinds(t *testing.T) {
	for _, tc := range []struct {
		name   string
		script func(p *peer)
		code   codes.Code
		kinds  []string
	}{{
		name: "the plugin's status",
		script: func(p *peer) {
			p.hello()
			s := p.readRequest(notify, true)
			p.headers(s, true, append(okHeaders, "grpc-status", "9", "grpc-message", "not now")...)
			p.drain()
		},
		code: codes.FailedPrecondition,
	}, {
		name: "HTTP 404",
		script: func(p *peer) {
			p.hello()
			s := p.readRequest(notify, true)
			p.headers(s, true, ":status", "404")
			p.drain()
		},
		code: codes.Unimplemented,
	}, {
		// The request was read, then the connection dropped: the plugin
		// may have acted on it and must not be told again.
		name: "dropped after the request",
		script: func(p *peer) {
			p.hello()
			p.readRequest(notify, true)
		},
		code:  codes.Unavailable,
		kinds: []string{"ErrHangup", "ErrMaybeDelivered"},
	}, {
		// The request's DATA waits for a window the peer never opens.
		name: "dropped before the request was sent",
		script: func(p *peer) {
			p.hello(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
			p.readHeaders(notify, true)
		},
		code:  codes.Unavailable,
		kinds: []string{"ErrHangup"},
	}, {
		name: "refused stream",
		script: func(p *peer) {
			p.hello()
			s := p.readRequest(notify, true)
			p.check(p.fr.WriteRSTStream(s, http2.ErrCodeRefusedStream))
			p.drain()
		},
		code: codes.Unavailable,
	}, {
		name: "reset as a protocol error",
		script: func(p *peer) {
			p.hello()
			s := p.readRequest(notify, true)
			p.check(p.fr.WriteRSTStream(s, http2.ErrCodeProtocol))
			p.drain()
		},
		code:  codes.Internal,
		kinds: []string{"ErrProtocol", "ErrMaybeDelivered"},
	}, {
		name: "not gRPC's content-type",
		script: func(p *peer) {
			p.hello()
			s := p.readRequest(notify, true)
			p.headers(s, false, ":status", "200", "content-type", "text/html")
			p.drain()
		},
		code:  codes.Internal,
		kinds: []string{"ErrProtocol", "ErrMaybeDelivered"},
	}, {
		name: "GOAWAY not covering the call",
		script: func(p *peer) {
			p.hello()
			p.readRequest(notify, true)
			p.check(p.fr.WriteGoAway(0, http2.ErrCodeEnhanceYourCalm, []byte("too_many_pings")))
			p.drain()
		},
		code:  codes.Unavailable,
		kinds: []string{"ErrHangup"},
	}, {
		name: "GOAWAY COMPRESSION_ERROR",
		script: func(p *peer) {
			p.hello()
			p.readRequest(notify, true)
			p.check(p.fr.WriteGoAway(0, http2.ErrCodeCompression, nil))
			p.drain()
		},
		code:  codes.Unavailable,
		kinds: []string{"ErrHangup", "ErrProtocol"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			c := dial(t, rawPeer(t, tc.script))
			ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout)
			defer cancel()
			err := c.Invoke(ctx, notify, &registerapi.RegistrationStatus{PluginRegistered: true}, &registerapi.RegistrationStatusResponse{}, 1<<16)
			wantCode(t, err, tc.code)
			wantKinds(t, err, tc.kinds...)
			c.Close()
		})
	}
}

// expiring is a context whose deadline passes when the test says: a real
// deadline could pass before the request is sent on a loaded machine.
type expiring struct {
	context.Context
	done chan struct{}
}

func (e *expiring) Deadline() (time.Time, bool) { return time.Now().Add(testenv.Timeout), true }
func (e *expiring) Done() <-chan struct{}       { return e.done }
func (e *expiring) Err() error {
	select {
	case <-e.done:
		return context.DeadlineExceeded
	default:
		return nil
	}
}

func TestErrorKindsDeadline(t *testing.T) {
	ctx := &expiring{Context: context.Background(), done: make(chan struct{})}
	c := dial(t, rawPeer(t, func(p *peer) {
		p.hello()
		p.readRequest(notify, true)
		close(ctx.done) // the deadline passes once the request is in
		p.drain()
	}))
	err := c.Invoke(ctx, notify, &registerapi.RegistrationStatus{}, &registerapi.RegistrationStatusResponse{}, 1<<16)
	wantCode(t, err, codes.DeadlineExceeded)
	wantKinds(t, err, "DeadlineExceeded", "ErrMaybeDelivered")

	// Nothing is sent on a connection an error left unusable.
	_, err = info(c, testenv.Timeout, 1<<16)
	wantCode(t, err, codes.Unavailable)
	wantKinds(t, err, "DeadlineExceeded")
}

func TestErrorKindsDial(t *testing.T) {
	dir := testenv.ShortDir(t, "unaryconn")
	refused := filepath.Join(dir, "refused.sock")
	l, err := net.Listen("unix", refused)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout)
	defer cancel()
	_, err = Dial(ctx, refused)
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("Dial of a refusing socket: %v", err)
	}
	wantKinds(t, err)

	garbage := rawPeer(t, func(p *peer) {
		_, err := p.nc.Write([]byte("HTTP/1.1 400 Bad Request\r\n\r\n"))
		p.check(err)
		p.drain()
	})
	_, err = Dial(ctx, garbage)
	wantKinds(t, err, "ErrProtocol", "ErrHandshake")
	if _, ok := status.FromError(err); !ok {
		t.Errorf("Dial's error %v is not a status error", err)
	}
}
