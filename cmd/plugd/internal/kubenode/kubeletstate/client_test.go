package kubeletstate

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/plugd/plugd/internal/testenv"
)

// A registration at a socket's path counts for a re-created socket once
// it began after the socket was made, or the kubelet has had its loop's
// time to replace the old one; and, where the kubelet was retrying a
// registration at the path when the socket was made, once it has held
// that long or been made again.
func TestCredited(t *testing.T) {
	made := time.Date(2026, 1, 1, 0, 0, 10, 0, time.UTC)
	after := made.Add(300 * time.Millisecond)
	refused := made.Add(-3 * time.Second) // the kubelet retrying since
	for _, tc := range []struct {
		name   string
		run    pathRun
		readAt time.Time
		want   bool
	}{
		{"registered after the socket was made", pathRun{present: after}, after, true},
		{"the old socket's registration, just after", pathRun{present: made.Add(-time.Minute)}, made.Add(500 * time.Millisecond), false},
		{"the old socket's registration, a loop later", pathRun{present: made.Add(-time.Minute)}, made.Add(Settle), true},
		{"a socket from before plugd's first read", pathRun{present: made.Add(time.Hour)}, made.Add(time.Hour), true},
		{"seen before it registered, after the socket was made", pathRun{present: after, retrying: made.Add(100 * time.Millisecond)}, after, true},
		{"a refused registration's retry, just after", pathRun{present: after, retrying: refused}, after.Add(time.Second), false},
		{"a refused registration's retry, held a loop", pathRun{present: after, retrying: refused}, after.Add(Settle), true},
		{"registered again since the socket was made", pathRun{present: made.Add(2 * time.Second), retrying: refused, dropped: made.Add(time.Second)}, made.Add(2 * time.Second), true},
		{"dropped before the socket was made", pathRun{present: after, retrying: refused, dropped: refused.Add(time.Second)}, after, false},
	} {
		if got := credited(made, tc.run, tc.readAt); got != tc.want {
			t.Errorf("%s: credited = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestReregistering: a registration the kubelet's actual state dropped
// while its desired state kept the path, after the socket was made, is
// the kubelet registering the path again: credited for one pass
// (Settle), then not.
func TestReregistering(t *testing.T) {
	const path = "/r/csi.sock"
	made := time.Date(2026, 1, 1, 0, 0, 10, 0, time.UTC)
	dropped := made.Add(2 * time.Second)
	for _, tc := range []struct {
		name           string
		created        time.Time
		readAt         time.Time
		registeredLast bool
		want           bool
	}{
		{"dropped, at once", made, dropped, false, true},
		{"dropped, within the pass", made, dropped.Add(Settle - time.Millisecond), false, true},
		{"dropped, the pass over", made, dropped.Add(Settle), false, false},
		{"dropped before the socket was made", dropped.Add(time.Millisecond), dropped.Add(time.Millisecond), false, false},
		{"registered again", made, dropped.Add(time.Second), true, false},
	} {
		var rec Record
		read := func(at time.Time, registered bool) {
			r := Reading{At: at, Started: made.Add(-time.Hour), Registered: map[string]bool{}, Seen: map[string]bool{path: true}}
			r.Registered[path] = registered
			if !registered {
				delete(r.Registered, path)
			}
			rec.Read(r)
		}
		read(made.Add(time.Second), true)
		read(dropped, false)
		if !tc.readAt.Equal(dropped) {
			read(tc.readAt, tc.registeredLast)
		}
		if got := rec.Evidence().Reregistering(path, tc.created); got != tc.want {
			t.Errorf("%s: Reregistering = %v, want %v", tc.name, got, tc.want)
		}
		if got, want := rec.Evidence().Credited(path, tc.created), tc.want || tc.registeredLast; got != want {
			t.Errorf("%s: Credited = %v, want %v", tc.name, got, want)
		}
	}
}

// metricsText is a kubelet's /metrics, trimmed: what plugd reads among
// what it does not.
const metricsText = `# HELP apiserver_audit_event_total [ALPHA] Counter of audit events generated and sent to the audit backend.
# TYPE apiserver_audit_event_total counter
apiserver_audit_event_total 0
# HELP plugin_manager_total_plugins [ALPHA] Number of plugins in Plugin Manager
# TYPE plugin_manager_total_plugins gauge
plugin_manager_total_plugins{socket_path="/var/lib/kubelet/plugins_registry/csi-reg.sock",state="actual_state_of_world"} 1
plugin_manager_total_plugins{socket_path="/var/lib/kubelet/plugins_registry/csi-reg.sock",state="desired_state_of_world"} 1
plugin_manager_total_plugins{socket_path="/var/lib/kubelet/plugins_registry/sub/gpu.sock",state="desired_state_of_world"} 1
plugin_manager_total_plugins{socket_path="/elsewhere/x.sock",state="actual_state_of_world"} 1
# HELP process_start_time_seconds [ALPHA] Start time of the process since unix epoch in seconds.
# TYPE process_start_time_seconds gauge
process_start_time_seconds 1.76722e+09
`

// kubeletServer serves body as a kubelet's /metrics over TLS, to the
// token "good" alone, gzipped when asked.
func kubeletServer(t *testing.T, body string) (*httptest.Server, string) {
	t.Helper()
	return tlsServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Header.Get("Authorization") {
		case "Bearer good":
		case "Bearer weak":
			http.Error(w, "Forbidden (user=system:serviceaccount:plugd:plugd, verb=get, resource=nodes, subresource(s)=[metrics])", http.StatusForbidden)
			return
		default:
			http.Error(w, "Unauthorized", http.StatusUnauthorized)
			return
		}
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		if strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
			w.Header().Set("Content-Encoding", "gzip")
			zw := gzip.NewWriter(w)
			fmt.Fprint(zw, body)
			zw.Close()
			return
		}
		fmt.Fprint(w, body)
	}))
}

// tlsServer serves h over TLS on loopback, and writes its certificate to
// a file, to be kubernetes.kubelet.caFile.
func tlsServer(t *testing.T, h http.Handler) (*httptest.Server, string) {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the handshakes the tests fail on purpose
	srv.StartTLS()
	t.Cleanup(srv.Close)
	ca := filepath.Join(t.TempDir(), "kubelet.crt")
	if err := os.WriteFile(ca, pemCert(srv), 0o600); err != nil {
		t.Fatal(err)
	}
	return srv, ca
}

func pemCert(srv *httptest.Server) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
}

func TestReadKubeletMetrics(t *testing.T) {
	long := "plugin_manager_total_plugins{socket_path=\"/var/lib/kubelet/plugins_registry/" + strings.Repeat("x", 2*maxMetricsLine) + "\",state=\"actual_state_of_world\"} 1\n"
	srv, ca := kubeletServer(t, strings.Replace(metricsText, "# HELP process", long+"# HELP process", 1))
	addr := srv.Listener.Addr().String()
	client := func(cfg Config, token string) *Client {
		t.Helper()
		cfg.Address = addr
		c, err := NewClient(cfg, &rest.Config{BearerToken: token}, "example.com", "/plugd/registry")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.close)
		return c
	}
	ctx := context.Background()
	c := client(Config{CAFile: ca, RegistryDir: "/var/lib/kubelet/plugins_registry"}, "good")
	s, err := c.readMetrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !s.Started.Equal(time.Unix(1767220000, 0)) {
		t.Errorf("started %s", s.Started)
	}
	if len(s.Registered) != 1 || !s.Registered["/plugd/registry/csi-reg.sock"] {
		t.Errorf("registered %v; want the one socket under the registry directory, by plugd's path", s.Registered)
	}
	if len(s.Seen) != 2 || !s.Seen["/plugd/registry/sub/gpu.sock"] {
		t.Errorf("seen %v", s.Seen)
	}
	if s.Bytes == 0 || s.Bytes >= int64(len(metricsText)+len(long)) {
		t.Errorf("%d bytes read; want the gzipped size", s.Bytes)
	}

	for _, tc := range []struct {
		name   string
		cfg    Config
		token  string
		reason string
		say    string
	}{
		{"forbidden", Config{CAFile: ca}, "weak", ReasonForbidden, `lacks the permission "get nodes/metrics"`},
		{"unauthorized", Config{CAFile: ca}, "nobody", ReasonUnauthorized, "webhook authentication"},
		{"unknown certificate", Config{}, "good", ReasonTLS, "caFile"},
		{"another name", Config{CAFile: ca, ServerName: "node-b"}, "good", ReasonTLS, "serverName"},
		{"insecure", Config{InsecureSkipVerify: true}, "good", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := client(tc.cfg, tc.token).readMetrics(ctx)
			if tc.reason == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil {
				t.Fatal("read")
			}
			p := classify(Config{Address: addr}, err, time.Now())
			if p.Reason != tc.reason || !strings.Contains(p.Message, tc.say) {
				t.Errorf("problem %s: %s; want %s saying %q", p.Reason, p.Message, tc.reason, tc.say)
			}
		})
	}

	// Nothing listens: the kubelet is not running.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close()
	c, err = NewClient(Config{Address: closed, CAFile: ca}, &rest.Config{}, "example.com", "/r")
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	_, err = c.readMetrics(ctx)
	if p := classify(Config{Address: closed}, err, time.Now()); p.Reason != ReasonNotRunning {
		t.Errorf("a closed port: %s: %s", p.Reason, p.Message)
	}
}

// The held connection ends when the kubelet's side closes it.
func TestHoldEndsWithTheKubelet(t *testing.T) {
	srv, ca := kubeletServer(t, metricsText)
	c, err := NewClient(Config{Address: srv.Listener.Addr().String(), CAFile: ca}, &rest.Config{}, "example.com", "/r")
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	up := make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- c.hold(context.Background(), func() { close(up) }) }()
	select {
	case <-up:
	case err := <-done:
		t.Fatalf("hold: %v", err)
	case <-time.After(testenv.Timeout):
		t.Fatal("not connected")
	}
	srv.CloseClientConnections()
	select {
	case err := <-done:
		if err == nil {
			t.Error("hold returned no reason")
		}
	case <-time.After(testenv.Timeout):
		t.Fatal("hold did not return when the kubelet closed the connection")
	}
	// And with ctx.
	ctx, cancel := context.WithCancel(context.Background())
	up = make(chan struct{})
	go func() { done <- c.hold(ctx, func() { close(up) }) }()
	<-up
	cancel()
	if err := <-done; err != context.Canceled {
		t.Errorf("hold after cancel: %v", err)
	}
}

// gzipped is text as a kubelet sends it, compressed.
func gzipped(t *testing.T, text []byte) []byte {
	t.Helper()
	var b bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&b, gzip.BestSpeed)
	if _, err := zw.Write(text); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// Issue 33, item 5: a large /metrics, of the samples plugd reads, is read
// with bounded memory, and one past the bounds is an error that names
// the bound. Before, the text of every wanted line was kept, then parsed
// whole at about 11 times its size: 24 MB of text, 0.3 MB gzipped, took
// over 300 MB, and a pod limited to 128 MiB was killed. The bodies are
// gzip members repeated (a gzip stream may hold several), so that the
// test compresses 1 MB, not 88.
func TestReadLargeKubeletMetrics(t *testing.T) {
	var text bytes.Buffer
	for i := 0; text.Len() < 1<<20; i++ {
		fmt.Fprintf(&text, "plugin_manager_total_plugins{socket_path=\"/var/lib/kubelet/plugins_registry/p%07d.sock\",state=\"desired_state_of_world\"} 1\n", i)
	}
	sockets := bytes.Count(text.Bytes(), []byte("\n"))
	member := gzipped(t, text.Bytes())
	big := slices.Concat(gzipped(t, []byte("# TYPE plugin_manager_total_plugins gauge\n")), bytes.Repeat(member, 24),
		gzipped(t, []byte("# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds 1.76722e+09\n")))
	bomb := bytes.Repeat(gzipped(t, bytes.Repeat([]byte("x"), 1<<20)), maxMetricsText>>20+1)
	var serve atomic.Pointer[[]byte]
	srv, ca := tlsServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Encoding", "gzip")
		w.Write(*serve.Load())
	}))
	c, err := NewClient(Config{Address: srv.Listener.Addr().String(), CAFile: ca, RegistryDir: "/var/lib/kubelet/plugins_registry"},
		&rest.Config{}, "example.com", "/r")
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	// The read's memory is measured, not its time: under the race
	// detector on a loaded machine, 24 MB take longer than a kubelet's
	// deadline.
	c.timeout = testenv.Timeout
	if err := c.buildTransport(c.rc); err != nil {
		t.Fatal(err)
	}

	serve.Store(&big)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	s, err := c.readMetrics(context.Background())
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Seen) != sockets || s.Started.IsZero() {
		t.Errorf("%d sockets seen, started %v; want %d and the start time", len(s.Seen), s.Started, sockets)
	}
	const bound = 128 << 20 // the chart's memory limit
	if got := after.TotalAlloc - before.TotalAlloc; got > bound {
		t.Errorf("reading 24 MB of metrics allocated %d MB; want less than %d MB", got>>20, bound>>20)
	} else {
		t.Logf("allocated %d MB", got>>20)
	}

	serve.Store(&bomb)
	_, err = c.readMetrics(context.Background())
	if want := "larger than 64 MiB uncompressed"; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("a gzip bomb: %v; want an error that says %q", err, want)
	}
}
