package api

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// A busy plugd (503 with Retry-After) is asked again a few times; one that
// stays busy is ErrBusy, and a 503 without Retry-After (not ready) is not
// retried.
func TestBusyIsRetried(t *testing.T) {
	var asked, busyFor atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := asked.Add(1)
		switch {
		case r.URL.Path == "/readyz":
			w.WriteHeader(http.StatusServiceUnavailable)
			w.Write([]byte(`{"error": "not ready"}`))
		case n <= busyFor.Load():
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusServiceUnavailable)
			w.Write([]byte(`{"error": "busy"}`))
		default:
			w.Write([]byte(`{"plugins": []}`))
		}
	}))
	defer srv.Close()
	c := &Client{Address: srv.URL}
	ctx := context.Background()

	busyFor.Store(2)
	if _, err := c.Plugins(ctx, Filter{}); err != nil || asked.Load() != 3 {
		t.Errorf("busy twice: %v after %d requests, want success after 3", err, asked.Load())
	}
	asked.Store(0)
	busyFor.Store(100)
	if _, err := c.Plugins(ctx, Filter{}); !errors.Is(err, ErrBusy) || asked.Load() != int64(len(busyRetries)+1) {
		t.Errorf("always busy: %v after %d requests, want ErrBusy after %d", err, asked.Load(), len(busyRetries)+1)
	}
	asked.Store(0)
	if err := c.Ready(ctx); !errors.Is(err, ErrNotReady) || errors.Is(err, ErrBusy) || asked.Load() != 1 {
		t.Errorf("not ready: %v after %d requests, want ErrNotReady after 1", err, asked.Load())
	}
}
