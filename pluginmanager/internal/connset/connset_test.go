package connset

import (
	"context"
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

// serve runs a registration server on a socket at path until the test ends
// or stop is called.
func serve(t *testing.T, path string) (stop func()) {
	t.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	registerapi.RegisterRegistrationServer(srv, registration{})
	done := make(chan struct{})
	go func() { defer close(done); srv.Serve(l) }()
	stop = func() { srv.Stop(); <-done }
	t.Cleanup(stop)
	return stop
}

// started runs a set until the test ends; hung-up paths arrive on the channel.
func started(t *testing.T) (*Set, <-chan string) {
	t.Helper()
	hung := make(chan string, 16)
	s, err := New(func(path string) { hung <- path })
	if err != nil {
		t.Fatal(err)
	}
	go s.Run()
	t.Cleanup(s.Close)
	return s, hung
}

func dial(t *testing.T, path string) *unaryconn.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := unaryconn.Dial(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// After 2^32 watches the 32-bit ids come round; none may be the eventfd's
// -1, which ends Run, or one still in use.
func TestIDsSkipTheStopSignalAndIDsInUse(t *testing.T) {
	path := filepath.Join(testenv.ShortDir(t, "connset"), "p.sock")
	stop := serve(t, path)
	s, hung := started(t)
	watch := func(key string) int32 {
		t.Helper()
		if err := s.Watch(key, dial(t, path)); err != nil {
			t.Fatal(err)
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.byPath[key].id
	}
	s.mu.Lock()
	s.next = 0
	s.mu.Unlock()
	if id := watch("first"); id != 1 {
		t.Fatalf("first id %d", id)
	}
	s.mu.Lock()
	s.next = -3 // the last id given
	s.mu.Unlock()
	for i, want := range []int32{-2, 0, 2} { // -1 skipped, 1 in use
		if id := watch(fmt.Sprint(i)); id != want {
			t.Errorf("id %d, want %d", id, want)
		}
	}

	stop() // every watched connection hangs up
	seen := map[string]bool{}
	for range 4 {
		select {
		case p := <-hung:
			seen[p] = true
		case <-s.done:
			t.Fatal("Run returned: hang-ups no longer watched")
		case <-time.After(10 * time.Second):
			t.Fatalf("hang-ups reported: %v, want 4", seen)
		}
	}
	for _, key := range []string{"first", "0", "1", "2"} {
		if !seen[key] || s.Watching(key) {
			t.Errorf("%s: hang-up reported %v, still watched %v", key, seen[key], s.Watching(key))
		}
	}
}

// Take hands the connection back out of the set, open; Watch for a path
// already watched replaces its connection; Unwatch closes it.
func TestTakeWatchUnwatch(t *testing.T) {
	path := filepath.Join(testenv.ShortDir(t, "connset"), "p.sock")
	serve(t, path)
	s, hung := started(t)
	first := dial(t, path)
	if err := s.Watch("p", first); err != nil {
		t.Fatal(err)
	}
	second := dial(t, path)
	if err := s.Watch("p", second); err != nil {
		t.Fatal(err)
	}
	if !closed(first) {
		t.Error("the replaced connection is still open")
	}
	if c := s.Take("p"); c != second || closed(c) || s.Watching("p") {
		t.Fatalf("Take = %p, want the second connection (%p), open and out of the set", c, second)
	}
	if c := s.Take("p"); c != nil {
		t.Error("Take of a taken connection handed it out again")
	}
	if err := s.Watch("p", second); err != nil {
		t.Fatal(err)
	}
	s.Unwatch("p")
	if !closed(second) || s.Watching("p") {
		t.Error("Unwatch left the connection open or in the set")
	}
	select {
	case p := <-hung:
		t.Errorf("hang-up of %s reported for a connection the set closed itself", p)
	default:
	}
}

// closed reports whether c's socket is closed.
func closed(c *unaryconn.Conn) bool {
	raw, err := c.SyscallConn()
	if err != nil {
		return true
	}
	return raw.Control(func(uintptr) {}) != nil
}
