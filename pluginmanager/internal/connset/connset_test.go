package connset

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/plugd/plugd/internal/testenv"
	"github.com/plugd/plugd/internal/unaryconn"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type registration struct {
	registerapi.UnimplementedRegistrationServer
}

func (registration) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	return &registerapi.PluginInfo{Type: "CSIPlugin", Name: "p"}, nil
}

// serve runs a registration server on a socket at path until the test ends.
func serve(t *testing.T, path string) *grpc.Server {
	t.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	registerapi.RegisterRegistrationServer(srv, registration{})
	done := make(chan struct{})
	go func() { defer close(done); srv.Serve(l) }()
	t.Cleanup(func() { srv.Stop(); <-done })
	return srv
}

type hangup struct {
	path string
	err  error
}

// started makes a set closed at the end of the test; hang-ups arrive on the
// channel.
func started(t *testing.T) (*Set, <-chan hangup) {
	t.Helper()
	hung := make(chan hangup, 16)
	s := New(func(path string, err error) { hung <- hangup{path, err} })
	t.Cleanup(s.Close)
	return s, hung
}

func dial(t *testing.T, path string) *unaryconn.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout)
	defer cancel()
	c, err := unaryconn.Dial(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func socket(t *testing.T) string {
	return filepath.Join(testenv.ShortDir(t, "connset"), "p.sock")
}

// noHangup checks that nothing more was reported. It is decisive after
// the set's Close, which waits for reports under way.
func noHangup(t *testing.T, hung <-chan hangup) {
	t.Helper()
	select {
	case h := <-hung:
		t.Errorf("hang-up of %s reported: %v", h.path, h.err)
	default:
	}
}

// Every connection held to a plugin whose server stops is reported, once,
// with ErrHangup, and is out of the set by then.
func TestHangups(t *testing.T) {
	path := socket(t)
	srv := serve(t, path)
	s, hung := started(t)
	for i := range 3 {
		if err := s.Watch(fmt.Sprint(i), dial(t, path)); err != nil {
			t.Fatal(err)
		}
	}
	srv.Stop()
	seen := map[string]bool{}
	for range 3 {
		select {
		case h := <-hung:
			if seen[h.path] || !errors.Is(h.err, unaryconn.ErrHangup) {
				t.Errorf("hang-up of %s: %v (seen before: %v)", h.path, h.err, seen[h.path])
			}
			seen[h.path] = true
			if s.Watching(h.path) || s.Get(h.path) != nil {
				t.Errorf("%s is still in the set after its hang-up", h.path)
			}
		case <-time.After(testenv.Timeout):
			t.Fatalf("hang-ups reported: %v, want 3", seen)
		}
	}
	s.Close() // waits for every report under way: what was reported is in hung
	noHangup(t, hung)
}

// A server stopping gracefully sends GOAWAY to an idle connection and waits
// for it to close: that is a hang-up, and the set lets GracefulStop return.
func TestGracefulStop(t *testing.T) {
	path := socket(t)
	srv := serve(t, path)
	s, hung := started(t)
	if err := s.Watch("p", dial(t, path)); err != nil {
		t.Fatal(err)
	}
	stopped := make(chan struct{})
	go func() { srv.GracefulStop(); close(stopped) }()
	select {
	case h := <-hung:
		if !errors.Is(h.err, unaryconn.ErrHangup) {
			t.Errorf("hang-up %v, not ErrHangup", h.err)
		}
	case <-time.After(testenv.Timeout):
		t.Fatal("no hang-up on GOAWAY")
	}
	select {
	case <-stopped:
	case <-time.After(testenv.Timeout):
		t.Fatal("GracefulStop still waits for the connection")
	}
}

// Get hands out the connection while it stays in the set, and a call on it
// leaves it watched; Watch for a path already held replaces its connection;
// Unwatch closes it; neither is reported as a hang-up.
func TestGetWatchUnwatch(t *testing.T) {
	path := socket(t)
	srv := serve(t, path)
	s, hung := started(t)
	first := dial(t, path)
	if err := s.Watch("p", first); err != nil {
		t.Fatal(err)
	}
	second := dial(t, path)
	if err := s.Watch("p", second); err != nil {
		t.Fatal(err)
	}
	if first.Usable() {
		t.Error("the replaced connection is still open")
	}
	c := s.Get("p")
	if c != second || !s.Watching("p") {
		t.Fatalf("Get = %p, want the second connection (%p), still in the set", c, second)
	}
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout)
	defer cancel()
	if err := c.Invoke(ctx, "/pluginregistration.Registration/GetInfo", &registerapi.InfoRequest{}, new(registerapi.PluginInfo), 1<<16); err != nil {
		t.Fatal(err)
	}
	if err := s.Watch("p", c); err != nil || !s.Watching("p") {
		t.Fatalf("Watch of the connection held: %v, watching %v", err, s.Watching("p"))
	}
	noHangup(t, hung)

	// Still watched after the call: the server stopping is heard.
	third := dial(t, path)
	if err := s.Watch("q", third); err != nil {
		t.Fatal(err)
	}
	s.Unwatch("q")
	if third.Usable() || s.Watching("q") {
		t.Error("Unwatch left the connection open or in the set")
	}
	srv.Stop()
	select {
	case h := <-hung:
		if h.path != "p" {
			t.Errorf("hang-up of %s, want p only", h.path)
		}
	case <-time.After(testenv.Timeout):
		t.Fatal("no hang-up after a call was made on the connection")
	}
	s.Close() // waits for every report under way: what was reported is in hung
	noHangup(t, hung)
}

// After Close, nothing is reported and Watch refuses (closing what it was
// given).
func TestClose(t *testing.T) {
	path := socket(t)
	srv := serve(t, path)
	hung := make(chan hangup, 16)
	s := New(func(path string, err error) { hung <- hangup{path, err} })
	c := dial(t, path)
	if err := s.Watch("p", c); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s.Close()
	if c.Usable() {
		t.Error("Close left a connection open")
	}
	late := dial(t, path)
	if err := s.Watch("q", late); !errors.Is(err, ErrClosed) || late.Usable() {
		t.Errorf("Watch after Close: %v, connection usable %v", err, late.Usable())
	}
	srv.Stop()
	noHangup(t, hung)
}
