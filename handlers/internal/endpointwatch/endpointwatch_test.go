package endpointwatch

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/plugd/plugd/internal/confine"
	"github.com/plugd/plugd/internal/testenv"
	"github.com/plugd/plugd/internal/unaryconn"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// serve runs a gRPC server (no service: the watch asks nothing) on path
// until stop, which removes the socket, as a stopping driver does.
func serve(t *testing.T, path string) (stop func()) {
	return testenv.ServeGRPC(t, path, nil).Stop
}

func next(t *testing.T, reports <-chan error) error {
	t.Helper()
	select {
	case err := <-reports:
		return err
	case <-time.After(testenv.Timeout):
		t.Fatal("no report")
		return nil
	}
}

// The endpoint is reported serving at the start, down when its server
// goes, and serving again once a server is back on its socket and the
// check passes; nothing after Stop.
func TestDownAndBack(t *testing.T) {
	path := filepath.Join(testenv.ShortDir(t, "ew"), "csi.sock")
	stop := serve(t, path)
	reports := make(chan error, 100)
	var failCheck atomic.Bool
	failCheck.Store(true)
	checks := atomic.Int32{}
	w, err := Start(context.Background(), path, Options{
		Report: func(err error) { reports <- err },
		Check: func(context.Context) error {
			checks.Add(1)
			if failCheck.Load() {
				return errors.New("not ready")
			}
			return nil
		},
		Backoff: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	if err := next(t, reports); err != nil {
		t.Fatalf("first report %v, want serving", err)
	}
	stop()
	if err := next(t, reports); err == nil {
		t.Fatal("serving, after the server stopped")
	}
	serve(t, path)
	// Connected, but the check fails: still down, and tried again.
	for checks.Load() < 2 {
		if err := next(t, reports); err == nil {
			t.Fatal("serving, while the check fails")
		}
	}
	failCheck.Store(false)
	for {
		if err := next(t, reports); err == nil {
			break
		}
	}
	w.Stop()
	w.Stop()
	select {
	case err := <-reports:
		t.Errorf("report after Stop: %v", err)
	default:
	}
}

// An endpoint that does not accept a connection fails Start, which reports
// nothing.
func TestStartFails(t *testing.T) {
	path := filepath.Join(testenv.ShortDir(t, "ew"), "none.sock")
	reported := false
	if _, err := Start(context.Background(), path, Options{Report: func(error) { reported = true }}); err == nil {
		t.Fatal("Start of a missing endpoint succeeded")
	}
	if reported {
		t.Error("a failed Start reported")
	}
}

// Issue 13, item 3: every reconnection goes through Options.Dial, so a
// handler's confinement holds after the first connection: an endpoint
// swapped for a symlink out of the roots while its server was down is
// refused, not connected to.
func TestReconnectionsDialConfined(t *testing.T) {
	base := testenv.ShortDir(t, "ewc")
	root, outside := filepath.Join(base, "root"), filepath.Join(base, "out")
	for _, d := range []string{root, outside} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(root, "csi.sock")
	stop := serve(t, path)
	evil := testenv.CountAccepts(t, filepath.Join(outside, "evil.sock"))
	reports := make(chan error, 100)
	w, err := Start(context.Background(), path, Options{
		Report:  func(err error) { reports <- err },
		Dial:    confine.Dialer{Roots: []string{root}}.Dial,
		Backoff: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	if err := next(t, reports); err != nil {
		t.Fatalf("first report %v, want serving", err)
	}
	stop()
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(outside, "evil.sock"), path); err != nil {
		t.Fatal(err)
	}
	for {
		err := next(t, reports)
		if err == nil {
			t.Fatal("serving, through a symlink out of the roots")
		}
		if errors.Is(err, confine.ErrOutside) {
			break
		}
	}
	if n := evil.Count(); n != 0 {
		t.Errorf("the watch connected %d times to the socket outside the roots", n)
	}
}

// Watches share the Poller they are given (a handler's); once it is closed,
// as the handler's Close does after stopping its watches, a watch that
// starts or connects again ends quietly: no report, no reconnection.
func TestSharedPollerClosed(t *testing.T) {
	dir := testenv.ShortDir(t, "ew")
	pl := unaryconn.NewPoller(unaryconn.PollerOptions{})
	reports := make(chan error, 100)
	opts := Options{Report: func(err error) { reports <- err }, Poller: pl, Backoff: 10 * time.Millisecond}
	var watches []*Watch
	for _, name := range []string{"a.sock", "b.sock"} {
		path := filepath.Join(dir, name)
		serve(t, path)
		w, err := Start(context.Background(), path, opts)
		if err != nil {
			t.Fatal(err)
		}
		watches = append(watches, w)
		if err := next(t, reports); err != nil {
			t.Fatalf("first report %v, want serving", err)
		}
	}
	pl.Close()
	path := filepath.Join(dir, "c.sock")
	serve(t, path)
	w, err := Start(context.Background(), path, opts)
	if err != nil {
		t.Fatal(err)
	}
	watches = append(watches, w)
	next(t, reports) // serving, said before the watch would start
	for _, w := range watches {
		w.Stop()
	}
	select {
	case err := <-reports:
		t.Errorf("a report after the Poller's Close: %v", err)
	default:
	}
}
