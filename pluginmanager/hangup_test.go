package pluginmanager

import (
	"context"
	"net"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/plugd/plugd/internal/testenv"
	"github.com/plugd/plugd/internal/unaryconn"
)

// After 2^32 watches the 32-bit ids come round; none may be the eventfd's
// -1, which ends run, or one still in use.
func TestHangupIDsSkipTheStopSignalAndIDsInUse(t *testing.T) {
	path := filepath.Join(testenv.ShortDir(t, "hangup"), "p.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	registerapi.RegisterRegistrationServer(srv, benchInfo{})
	go srv.Serve(l)
	defer srv.Stop()

	hung := make(chan *hangup, 4)
	h, err := newHangups(func(w *hangup) { hung <- w })
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { h.run(); close(done) }()
	defer func() { h.close(); <-done; h.release() }()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	watch := func() *hangup {
		c, err := unaryconn.Dial(ctx, path)
		if err != nil {
			t.Fatal(err)
		}
		w, err := h.watch(path, c)
		if err != nil {
			t.Fatal(err)
		}
		return w
	}
	h.mu.Lock()
	h.next = 0
	h.mu.Unlock()
	first := watch() // 1
	h.mu.Lock()
	h.next = -3 // the last id given
	h.mu.Unlock()
	for _, want := range []int32{-2, 0, 2} { // -1 skipped, 1 in use
		if w := watch(); w.id != want {
			t.Errorf("id %d, want %d", w.id, want)
		}
	}
	if first.id != 1 {
		t.Fatalf("first id %d", first.id)
	}

	srv.Stop() // every watched connection hangs up
	for range 4 {
		select {
		case <-hung:
		case <-done:
			t.Fatal("run returned: hang-ups no longer watched")
		case <-time.After(5 * time.Second):
			t.Fatal("a hang-up was not reported")
		}
	}
}
