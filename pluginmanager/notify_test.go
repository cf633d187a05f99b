package pluginmanager_test

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/plugd/plugd/internal/testenv"
	"github.com/plugd/plugd/pluginmanager"
)

// teller is a registration server that records what it is told, and does
// to the connection or the call what its notify says.
type teller struct {
	registerapi.UnimplementedRegistrationServer
	typ    string
	notify func(ctx context.Context) error

	mu   sync.Mutex
	told []bool
}

func (s *teller) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	return &registerapi.PluginInfo{Type: s.typ, Name: "teller", SupportedVersions: []string{"1.0.0"}}, nil
}

func (s *teller) NotifyRegistrationStatus(ctx context.Context, r *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	s.mu.Lock()
	s.told = append(s.told, r.PluginRegistered)
	s.mu.Unlock()
	if s.notify != nil {
		if err := s.notify(ctx); err != nil {
			return nil, err
		}
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}

func (s *teller) verdicts() []bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]bool(nil), s.told...)
}

// lastConn is a listener that keeps the connection it accepted last, for a
// server that drops it in the middle of a call, and counts those it accepted.
type lastConn struct {
	net.Listener
	n    atomic.Int64
	mu   sync.Mutex
	last net.Conn
}

func (l *lastConn) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
		l.mu.Lock()
		l.last = c
		l.mu.Unlock()
	}
	return c, err
}

// accepted is how many connections were accepted so far.
func (l *lastConn) accepted() int64 { return l.n.Load() }

func (l *lastConn) drop() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.last.Close()
}

// listenLast listens on a socket at path, keeping the last connection.
func listenLast(t *testing.T, path string) *lastConn {
	t.Helper()
	return &lastConn{Listener: testenv.ListenUnix(t, path)}
}

// serveTeller serves s (a teller, or a server built on one) on lc.
func serveTeller(t *testing.T, lc *lastConn, s registerapi.RegistrationServer) {
	t.Helper()
	srv := grpc.NewServer()
	registerapi.RegisterRegistrationServer(srv, s)
	done := make(chan struct{})
	go func() { defer close(done); srv.Serve(lc) }()
	t.Cleanup(func() { srv.Stop(); <-done })
}

// A plugin that received its verdict was told, whatever became of the call:
// node-driver-registrar exits when told false, sometimes before it answers,
// and the DRA helper answers a refusal with an error by design. Neither is
// a failure to tell, nor told again; a plugin told true whose connection
// drops before the answer is not told again either.
func TestToldOnceWhateverTheAnswer(t *testing.T) {
	for _, tc := range []struct {
		name       string
		typ        string // "CSIPlugin" registers; anything else is refused
		registered bool
		notify     func(l *lastConn) func(context.Context) error
	}{{
		name: "refused; exits inside the call",
		typ:  "Nope",
		notify: func(l *lastConn) func(context.Context) error {
			return func(ctx context.Context) error { l.drop(); <-ctx.Done(); return ctx.Err() }
		},
	}, {
		name: "refused; answers with an error",
		typ:  "Nope",
		notify: func(*lastConn) func(context.Context) error {
			return func(context.Context) error {
				return status.Error(codes.FailedPrecondition, "registration failed: not registered")
			}
		},
	}, {
		name:       "registered; the connection drops before the answer",
		typ:        "CSIPlugin",
		registered: true,
		notify: func(l *lastConn) func(context.Context) error {
			return func(ctx context.Context) error { l.drop(); <-ctx.Done(); return ctx.Err() }
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			log, warnings := testenv.WarnLogger()
			h := start(t, pluginmanager.Options{Logger: log}, map[string]pluginmanager.Handler{"CSIPlugin": pluginmanager.HandlerFuncs{}})
			path := filepath.Join(h.dir, "teller.sock")
			l := listenLast(t, path)
			s := &teller{typ: tc.typ, notify: tc.notify(l)}
			serveTeller(t, l, s)
			want := pluginmanager.StateRejected
			if tc.registered {
				want = pluginmanager.StateRegistered
			}
			st := h.WaitSocket(path, want)
			if tc.registered && st.Reason != "" {
				t.Errorf("registered with reason %s (%s): it was told", st.Reason, st.LastError)
			}
			h.Stop() // nothing more can be sent
			if got := s.verdicts(); len(got) != 1 || got[0] != tc.registered {
				t.Errorf("told %v, want %v once", got, tc.registered)
			}
			if w := warnings.String(); strings.Contains(w, "could not tell") || strings.Contains(w, "could not be told") {
				t.Errorf("warned of a plugin that was told:\n%s", w)
			}
		})
	}
}
