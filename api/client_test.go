package api

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"

	"go.uber.org/goleak"

	"github.com/plugd/plugd/internal/textsafe"
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

// hostile is a server that is not plugd: it answers every request with
// write, and keeps how many bytes it got out before the client hung up.
type hostile struct {
	*httptest.Server
	served         atomic.Int64
	acceptEncoding atomic.Value
	done           chan struct{} // a handler returned
}

func newHostile(t *testing.T, write func(w http.ResponseWriter, out io.Writer)) *hostile {
	t.Helper()
	h := &hostile{done: make(chan struct{}, 16)}
	h.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() { h.done <- struct{}{} }()
		h.acceptEncoding.Store(r.Header.Get("Accept-Encoding"))
		write(w, &countingWriter{w: w, n: &h.served})
	}))
	t.Cleanup(h.Close)
	return h
}

type countingWriter struct {
	w io.Writer
	n *atomic.Int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n.Add(int64(n))
	return n, err
}

// endless writes prefix, then fill until the client hangs up or limit
// bytes are out.
func endless(out io.Writer, prefix string, fill byte, limit int) {
	if _, err := io.WriteString(out, prefix); err != nil {
		return
	}
	chunk := bytes.Repeat([]byte{fill}, 64<<10)
	for written := 0; written < limit; written += len(chunk) {
		if _, err := out.Write(chunk); err != nil {
			return
		}
	}
}

// Issue 13, item 9: a client of a hostile server reads a bounded amount:
// an endless answer, an endless event line, a gzip bomb and a flood of
// headers each end with an error that says what was wrong, after at most
// the bound (plus what the kernel buffers) was sent.
func TestHostileServer(t *testing.T) {
	ctx := context.Background()
	// What loopback TCP may hold in flight beyond what the client read.
	const inFlight = 16 << 20
	allocated := func(f func()) uint64 {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		f()
		runtime.ReadMemStats(&after)
		return after.TotalAlloc - before.TotalAlloc
	}

	t.Run("endless answer", func(t *testing.T) {
		h := newHostile(t, func(w http.ResponseWriter, out io.Writer) {
			endless(out, `{"plugins": [{"id": "`, 'A', 512<<20)
		})
		var err error
		alloc := allocated(func() { _, err = (&Client{Address: h.URL}).Plugins(ctx, Filter{}) })
		<-h.done
		t.Logf("the client allocated %d MiB; the server got %d MiB out", alloc>>20, h.served.Load()>>20)
		if err == nil || !strings.Contains(err.Error(), "larger than 32 MiB") {
			t.Errorf("error %v, want one that says the answer is too large", err)
		}
		if h.served.Load() > MaxAnswerSize+inFlight {
			t.Errorf("the client read %d MiB", h.served.Load()>>20)
		}
	})

	t.Run("endless event", func(t *testing.T) {
		h := newHostile(t, func(w http.ResponseWriter, out io.Writer) {
			w.WriteHeader(http.StatusOK)
			http.NewResponseController(w).Flush()
			endless(out, `{"seq": 1, "type": "`, 'A', 512<<20)
		})
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		s, err := (&Client{Address: h.URL}).Events(ctx, 0)
		if err != nil {
			t.Fatal(err)
		}
		alloc := allocated(func() { _, err = s.Next() })
		s.Close()
		<-h.done
		t.Logf("the client allocated %d MiB; the server got %d MiB out", alloc>>20, h.served.Load()>>20)
		if err == nil || !strings.Contains(err.Error(), "longer than 1024 KiB") {
			t.Errorf("error %v, want one that says the event is too long", err)
		}
		if h.served.Load() > MaxEventSize+inFlight {
			t.Errorf("the client read %d MiB", h.served.Load()>>20)
		}
	})

	t.Run("gzip bomb", func(t *testing.T) {
		h := newHostile(t, func(w http.ResponseWriter, out io.Writer) {
			w.Header().Set("Content-Encoding", "gzip")
			zw, _ := gzip.NewWriterLevel(out, gzip.BestSpeed)
			endless(zw, `{"plugins": [{"id": "`, 'A', 256<<20)
			zw.Close()
		})
		var err error
		alloc := allocated(func() { _, err = (&Client{Address: h.URL}).Plugins(ctx, Filter{}) })
		<-h.done
		t.Logf("the client allocated %d MiB; the server got %d KiB out", alloc>>20, h.served.Load()>>10)
		if err == nil || !strings.Contains(err.Error(), `compressed (Content-Encoding "gzip")`) {
			t.Errorf("error %v, want one that refuses the compressed answer", err)
		}
		if ae := h.acceptEncoding.Load(); ae != "" {
			t.Errorf("the client asked for Accept-Encoding %q", ae)
		}
		if alloc > 16<<20 {
			t.Errorf("the client allocated %d MiB", alloc>>20)
		}
	})

	t.Run("endless headers", func(t *testing.T) {
		h := newHostile(t, func(w http.ResponseWriter, out io.Writer) {
			for i := range 1000 {
				w.Header().Set(fmt.Sprintf("X-Junk-%d", i), strings.Repeat("j", 1000))
			}
			w.WriteHeader(http.StatusOK)
		})
		_, err := (&Client{Address: h.URL}).Plugins(ctx, Filter{})
		<-h.done
		if err == nil || !strings.Contains(err.Error(), "headers exceeded") {
			t.Errorf("error %v, want one about the headers' size", err)
		}
	})
}

// An error a server sends reaches the caller's error escaped, so that it
// cannot drive the terminal plugctl prints it on, and cut to 4 KiB.
func TestErrorMessageIsEscaped(t *testing.T) {
	const evil = "gone \x1b]0;owned\x07\x1b[2J"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprintf(w, `{"error": %q}`, evil+strings.Repeat("x", 8<<10))
	}))
	defer srv.Close()
	_, err := (&Client{Address: srv.URL}).Plugin(context.Background(), "x.sock")
	if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), `gone \x1b]0;owned\a\x1b[2J`) {
		t.Fatalf("error %v, want ErrNotFound with the message escaped", err)
	}
	if strings.ContainsAny(err.Error(), "\x1b\x07") || len(err.Error()) > 4<<10+100 {
		t.Errorf("error of %d bytes, unescaped or not cut: %q", len(err.Error()), err)
	}
}

// api keeps its own copy of internal/textsafe's rule (it imports only the
// standard library); the two must say the same.
func TestPrintableIsTextsafes(t *testing.T) {
	long := strings.Repeat("é", 100)
	for _, s := range []string{"plain text", "\x1b[31mred\n", "bidi \u202e", "bad \xff byte", "tab\there", long} {
		for _, max := range []int{4, 51, 1000} {
			if got, want := printable(s, max), textsafe.Printable(s, max); got != want {
				t.Errorf("printable(%q, %d) = %q, textsafe.Printable says %q", s, max, got, want)
			}
		}
	}
}
