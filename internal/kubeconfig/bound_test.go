package kubeconfig

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/plugd/plugd/internal/testenv"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("k8s.io/klog/v2.(*flushDaemon).run.func1"))
}

// hostile is an API server that answers every request with serve, on
// loopback, with TLS or without.
func hostile(t *testing.T, tls bool, serve http.HandlerFunc) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(serve)
	if tls {
		srv.EnableHTTP2 = true
		srv.StartTLS()
	} else {
		srv.Start()
	}
	t.Cleanup(func() {
		srv.CloseClientConnections() // a handler that still serves, in a failed test
		srv.Close()
	})
	return srv
}

// nodes is a client of the core API group at srv, bounded by l.
func nodes(t *testing.T, srv *httptest.Server, l *limits) corev1client.NodeInterface {
	t.Helper()
	rc := &rest.Config{Host: srv.URL}
	if srv.TLS != nil {
		rc.TLSClientConfig.Insecure = true
	}
	if l == nil {
		Bound(rc)
		Bound(rc) // a second time changes nothing
	} else {
		bound(rc, *l)
	}
	c, err := corev1client.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	return c.Nodes()
}

// Issue 25, item 11: an API server that answers a list with a body that
// never ends gets MaxBody bytes read, no more (so memory stays bounded),
// and the list fails with an error that names the bound; over HTTP/1.1 and
// HTTP/2 alike.
func TestEndlessBody(t *testing.T) {
	for _, tls := range []bool{false, true} {
		t.Run(fmt.Sprintf("tls=%v", tls), func(t *testing.T) {
			var written atomic.Int64
			handled := make(chan struct{})
			srv := hostile(t, tls, func(w http.ResponseWriter, r *http.Request) {
				defer close(handled)
				w.Header().Set("Content-Type", "application/json")
				n, _ := w.Write([]byte(`{"kind":"NodeList","apiVersion":"v1","items":[`))
				written.Add(int64(n))
				chunk := []byte(strings.Repeat(`{"metadata":{"name":"x"}},`, 1024))
				for r.Context().Err() == nil {
					n, err := w.Write(chunk)
					written.Add(int64(n))
					if err != nil {
						return
					}
				}
			})
			// Reading the 64 MiB takes 12 to 15 s under -race on 2 busy
			// cores, near testenv.Timeout: this one wait has three times
			// that, still only a bound on a hang.
			ctx, cancel := context.WithTimeout(context.Background(), 3*testenv.Timeout)
			defer cancel()
			_, err := nodes(t, srv, nil).List(ctx, metav1.ListOptions{})
			if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "larger than 64 MiB, more than any answer plugd asks for (kubeconfig.MaxBody)") || !strings.Contains(err.Error(), "GET "+srv.URL+"/api/v1/nodes") {
				t.Fatalf("an endless list: %v", err)
			}
			select {
			case <-handled:
			case <-time.After(testenv.Timeout):
				t.Fatal("the client still reads the endless body")
			}
			// What the kernel's socket buffers and HTTP/2's window hold
			// besides: a few MiB.
			if w := written.Load(); w > MaxBody+16<<20 {
				t.Errorf("the server wrote %d MiB before the client stopped reading (bound %d MiB)", w>>20, MaxBody>>20)
			}
		})
	}
}

// Issue 25, item 11: an API server that never answers, or sends its
// headers and then a trickle, gets a request other than a watch ended at
// the bound, with an error that says so.
func TestSlowAnswer(t *testing.T) {
	for _, tc := range []struct {
		name    string
		headers bool
		want    string
	}{
		{"no headers", false, "answer did not come within 1m0s (kubeconfig.Timeout): is the server"},
		{"a trickle", true, "answer did not come within 1m0s (kubeconfig.Timeout): is the server"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			started, trickled := make(chan struct{}), make(chan struct{})
			n := 0
			srv := hostile(t, false, func(w http.ResponseWriter, r *http.Request) {
				if tc.headers {
					w.Header().Set("Content-Type", "application/json")
					w.Write([]byte(`{"kind":"NodeList","items":[`))
					w.(http.Flusher).Flush()
				}
				close(started)
				tick := time.NewTicker(10 * time.Millisecond)
				defer tick.Stop()
				for {
					select {
					case <-r.Context().Done():
						return
					case <-tick.C:
						if tc.headers {
							w.Write([]byte(" "))
							w.(http.Flusher).Flush()
							if n++; n == 5 {
								close(trickled)
							}
						}
					}
				}
			})
			clk := clocktesting.NewFakeClock(time.Now())
			c := nodes(t, srv, &limits{maxBody: 1 << 20, timeout: time.Minute, clock: clk})
			done := make(chan error, 1)
			gotHeaders := make(chan struct{})
			ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{GotFirstResponseByte: func() { close(gotHeaders) }})
			go func() {
				_, err := c.List(ctx, metav1.ListOptions{})
				done <- err
			}()
			select {
			case <-started:
			case <-time.After(testenv.Timeout):
				t.Fatal("the request did not reach the server")
			}
			if tc.headers {
				// The body is being read: the client has the headers, and
				// the server has trickled since.
				<-gotHeaders
				<-trickled
			}
			clk.Step(time.Minute - time.Second)
			select {
			case err := <-done:
				t.Fatalf("the request ended before its time: %v", err)
			default:
			}
			clk.Step(time.Second)
			select {
			case err := <-done:
				if !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "GET "+srv.URL+"/api/v1/nodes") {
					t.Errorf("a slow server: %v", err)
				}
			case <-time.After(testenv.Timeout):
				t.Fatal("the request outlived its bound")
			}
		})
	}
}

// A watch is not ended by the bound once it has started: it lasts as
// long as the server keeps it. Its body is bounded as any answer is.
func TestWatchOutlivesTimeout(t *testing.T) {
	next := make(chan string)
	srv := hostile(t, false, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("watch") != "true" {
			http.Error(w, "a watch only", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.(http.Flusher).Flush()
		for {
			select {
			case <-r.Context().Done():
				return
			case name := <-next:
				fmt.Fprintf(w, `{"type":"ADDED","object":{"kind":"Node","apiVersion":"v1","metadata":{"name":%q}}}`+"\n", name)
				w.(http.Flusher).Flush()
			}
		}
	})
	clk := clocktesting.NewFakeClock(time.Now())
	wi, err := nodes(t, srv, &limits{maxBody: 1 << 20, timeout: time.Minute, clock: clk}).Watch(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer wi.Stop()
	for i := range 3 {
		clk.Step(time.Hour)
		name := fmt.Sprint("node-", i)
		select {
		case next <- name:
		case <-time.After(testenv.Timeout):
			t.Fatal("the server's watch ended")
		}
		select {
		case ev, ok := <-wi.ResultChan():
			if !ok || ev.Type != "ADDED" {
				t.Fatalf("event %d: %v %+v", i, ok, ev)
			}
		case <-time.After(testenv.Timeout):
			t.Fatalf("no event %d", i)
		}
	}
	// A watch carries events for as long as it lasts (the caretaker's, of
	// every Node): what it carries in all is not bounded, each event is.
	for i := range 48 {
		name := fmt.Sprintf("node-%d-%s", i, strings.Repeat("x", 32<<10))
		select {
		case next <- name:
		case <-time.After(testenv.Timeout):
			t.Fatal("the server's watch ended")
		}
		select {
		case ev, ok := <-wi.ResultChan():
			if !ok || ev.Type != "ADDED" {
				t.Fatalf("event %d of 32 KiB, %d KiB in all: %v %.200v", i, (i+1)*32, ok, ev)
			}
		case <-time.After(testenv.Timeout):
			t.Fatalf("no event %d", i)
		}
	}
	// An event larger than the body's bound ends the watch with an error
	// that names the bound; its reader opens another.
	next <- strings.Repeat("x", 1<<20)
	select {
	case ev, ok := <-wi.ResultChan():
		if st, isStatus := ev.Object.(*metav1.Status); ok && (!isStatus || !strings.Contains(st.Message, "larger than 1 MiB, more than any answer plugd asks for (kubeconfig.MaxBody)")) {
			t.Errorf("an event over the bound: %+v", ev)
		}
	case <-time.After(testenv.Timeout):
		t.Fatal("an event over the bound did not end the watch")
	}
}

// The events of a watch are bounded one by one, as the API server frames
// them: a line of JSON, a length-prefixed protobuf frame.
func TestEvents(t *testing.T) {
	frame := func(n int) []byte {
		return append([]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}, bytes.Repeat([]byte{'p'}, n)...)
	}
	for _, tc := range []struct {
		contentType string
		stream      []byte
		ok          bool
	}{
		{"application/json", []byte(strings.Repeat(strings.Repeat("j", 99)+"\n", 50)), true},
		{"application/json", []byte(strings.Repeat("j", 60) + "\n" + strings.Repeat("j", 101) + "\n"), false},
		{"application/json", []byte(strings.Repeat("j", 101)), false}, // no end yet
		{"application/vnd.kubernetes.protobuf;stream=watch", bytes.Repeat(frame(100), 50), true},
		{"application/vnd.kubernetes.protobuf;stream=watch", append(frame(10), frame(101)[:4]...), false}, // its length says
		{"application/vnd.kubernetes.protobuf;stream=watch", frame(0), true},
	} {
		e := eventsOf(tc.contentType, 100)
		ok := true
		for b := tc.stream; len(b) > 0 && ok; b = b[min(3, len(b)):] { // in pieces that cut headers
			ok = e.take(b[:min(3, len(b))])
		}
		if ok != tc.ok {
			t.Errorf("%s, %d bytes: within the bound %v, want %v", tc.contentType, len(tc.stream), ok, tc.ok)
		}
	}
	if eventsOf("application/yaml", 100) != nil {
		t.Error("a watch of an unknown framing is not bounded whole")
	}
}
