package kubenode

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/pem"
	"fmt"
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

	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/client-go/rest"

	"github.com/plugd/plugd/api"
	"github.com/plugd/plugd/internal/testenv"
)

// What the running kubelet holds decides; CSINode and the Node only add
// details.
func TestLiveView(t *testing.T) {
	csi := key{TypeCSI, "csi.example.com"}
	gpu := key{TypeDevice, "vendor.example/gpu"}
	sock := Plugin{Socket: "/r/csi.sock", Type: TypeCSI, Name: "csi.example.com", Answering: true, Details: csiSaid("node-a")}
	dev := Plugin{Socket: "/r/gpu.sock", Type: TypeDevice, Name: "vendor.example/gpu", Answering: true}
	listed := snapshot{csiNode: csiNode(storagev1.CSINodeDriver{Name: "csi.example.com", NodeID: "node-a"})}
	labelled := listed
	labelled.node = node(nil, nil)
	labelled.node.Labels = map[string]string{"topology.example.com/node": "node-a"}
	holds := kubeletFacts{live: true, registered: map[string]bool{"/r/csi.sock": true, "/r/gpu.sock": true}, devices: map[string]int{"vendor.example/gpu": 3}}
	for _, tc := range []struct {
		name      string
		k         key
		socks     []Plugin
		s         snapshot
		kf        kubeletFacts
		mem       remembered
		state     string
		reason    string
		inMessage string
	}{
		{"registered", csi, []Plugin{sock}, listed, holds, remembered{}, api.KubeletRegistered, "", `holds /r/csi.sock; CSINode node-a lists it with nodeID "node-a"`},
		{"registered, CSINode not yet", csi, []Plugin{sock}, snapshot{csiNode: csiNode()}, holds, remembered{}, api.KubeletRegistered, "NotInCSINode", "does not list the driver"},
		{"CSINode lists it, the kubelet does not hold it", csi, []Plugin{sock}, listed, kubeletFacts{live: true}, remembered{}, api.KubeletNotRegistered, ReasonNotRegistered, "holds no socket of it"},
		{"seen, not registered", csi, []Plugin{sock}, listed, kubeletFacts{live: true, seen: map[string]bool{"/r/csi.sock": true}}, remembered{}, api.KubeletNotRegistered, ReasonSeenNotRegistered, "has seen /r/csi.sock"},
		{"restarted", csi, []Plugin{sock}, listed, kubeletFacts{live: true, restarted: true, started: time.Unix(100, 0)}, remembered{}, api.KubeletNotRegistered, ReasonKubeletRestarted, "restarted"},
		{"a socket made since the restart", csi, []Plugin{{Socket: "/r/csi.sock", Answering: true, Created: time.Unix(200, 0)}}, listed, kubeletFacts{live: true, restarted: true, started: time.Unix(100, 0)}, remembered{}, api.KubeletNotRegistered, ReasonNotRegistered, "holds no socket"},
		{"not running", csi, []Plugin{sock}, listed, kubeletFacts{down: true, address: "10.0.0.1:10250"}, remembered{}, api.KubeletNotRegistered, ReasonKubeletNotRunning, "nothing listens at 10.0.0.1:10250"},
		{"not read yet", csi, []Plugin{sock}, listed, kubeletFacts{}, remembered{}, api.KubeletUnknown, ReasonNotSynced, "not read"},
		{"topology conflict", csi, []Plugin{{Socket: "/r/csi.sock", State: "Stale"}}, labelled, kubeletFacts{live: true, seen: map[string]bool{"/r/csi.sock": true}},
			remembered{topology: map[string]string{"topology.example.com/node": "node-b"}}, api.KubeletNotRegistered, ReasonTopologyConflict,
			"reports topology.example.com/node=node-b but Node node-a has the label topology.example.com/node=node-a"},
		// The kubelet holds the socket while its CSI handler retries the
		// Node's update (seconds, in test/kube); the collision makes that
		// registration fail whatever the actual state says meanwhile.
		{"topology conflict, the kubelet still trying", csi, []Plugin{sock}, snapshot{csiNode: csiNode(), node: labelled.node}, holds,
			remembered{topology: map[string]string{"topology.example.com/node": "node-b"}}, api.KubeletNotRegistered, ReasonTopologyConflict, "kubectl label node node-a"},
		{"topology agrees", csi, []Plugin{sock}, labelled, holds, remembered{topology: map[string]string{"topology.example.com/node": "node-a"}}, api.KubeletRegistered, "", "holds"},
		{"inferred topology conflict", csi, []Plugin{sock}, labelled, kubeletFacts{problem: &Problem{Reason: ReasonKubeletTLS}},
			remembered{topology: map[string]string{"topology.example.com/node": "node-b"}}, api.KubeletRegistered, ReasonInferred, "inferred"},
		{"device, its live count", gpu, []Plugin{dev}, snapshot{}, holds, remembered{}, api.KubeletRegistered, "", "can allocate 3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.s.nodeName = "node-a"
			v := kubeletView(tc.k, tc.socks, tc.s, tc.kf, tc.mem)
			if v.State != tc.state || v.Reason != tc.reason || !strings.Contains(v.Message, tc.inMessage) {
				t.Errorf("view = %+v; want state %s, reason %q, a message with %q", v, tc.state, tc.reason, tc.inMessage)
			}
		})
	}
	v := kubeletView(gpu, []Plugin{dev}, snapshot{nodeName: "node-a", node: node(map[string]string{"vendor.example/gpu": "3"}, map[string]string{"vendor.example/gpu": "1"})}, holds, remembered{})
	if v.healthy != 3 || !v.healthyFresh {
		t.Errorf("the device count is %d (fresh %v); want the kubelet's 3, not the Node's allocatable", v.healthy, v.healthyFresh)
	}
}

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
		{"the old socket's registration, a loop later", pathRun{present: made.Add(-time.Minute)}, made.Add(kubeletSettle), true},
		{"a socket from before plugd's first read", pathRun{present: made.Add(time.Hour)}, made.Add(time.Hour), true},
		{"seen before it registered, after the socket was made", pathRun{present: after, retrying: made.Add(100 * time.Millisecond)}, after, true},
		{"a refused registration's retry, just after", pathRun{present: after, retrying: refused}, after.Add(time.Second), false},
		{"a refused registration's retry, held a loop", pathRun{present: after, retrying: refused}, after.Add(kubeletSettle), true},
		{"registered again since the socket was made", pathRun{present: made.Add(2 * time.Second), retrying: refused, dropped: made.Add(time.Second)}, made.Add(2 * time.Second), true},
		{"dropped before the socket was made", pathRun{present: after, retrying: refused, dropped: refused.Add(time.Second)}, after, false},
	} {
		if got := credited(made, tc.run, tc.readAt); got != tc.want {
			t.Errorf("%s: credited = %v, want %v", tc.name, got, tc.want)
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
	srv := httptest.NewTLSServer(h)
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
	client := func(cfg KubeletConfig, token string) *kubeletClient {
		t.Helper()
		cfg.Address = addr
		c, err := newKubeletClient(cfg, &rest.Config{BearerToken: token}, "example.com", "/plugd/registry")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.close)
		return c
	}
	ctx := context.Background()
	c := client(KubeletConfig{CAFile: ca, RegistryDir: "/var/lib/kubelet/plugins_registry"}, "good")
	s, err := c.readMetrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !s.started.Equal(time.Unix(1767220000, 0)) {
		t.Errorf("started %s", s.started)
	}
	if len(s.registered) != 1 || !s.registered["/plugd/registry/csi-reg.sock"] {
		t.Errorf("registered %v; want the one socket under the registry directory, by plugd's path", s.registered)
	}
	if len(s.seen) != 2 || !s.seen["/plugd/registry/sub/gpu.sock"] {
		t.Errorf("seen %v", s.seen)
	}
	if s.bytes == 0 || s.bytes >= int64(len(metricsText)+len(long)) {
		t.Errorf("%d bytes read; want the gzipped size", s.bytes)
	}

	for _, tc := range []struct {
		name   string
		cfg    KubeletConfig
		token  string
		reason string
		say    string
	}{
		{"forbidden", KubeletConfig{CAFile: ca}, "weak", ReasonKubeletForbidden, `lacks the permission "get nodes/metrics"`},
		{"unauthorized", KubeletConfig{CAFile: ca}, "nobody", ReasonKubeletUnauthorized, "webhook authentication"},
		{"unknown certificate", KubeletConfig{}, "good", ReasonKubeletTLS, "caFile"},
		{"another name", KubeletConfig{CAFile: ca, ServerName: "node-b"}, "good", ReasonKubeletTLS, "serverName"},
		{"insecure", KubeletConfig{InsecureSkipVerify: true}, "good", "", ""},
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
			p := classifyKubelet(KubeletConfig{Address: addr}, err, time.Now())
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
	c, err = newKubeletClient(KubeletConfig{Address: closed, CAFile: ca}, &rest.Config{}, "example.com", "/r")
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	_, err = c.readMetrics(ctx)
	if p := classifyKubelet(KubeletConfig{Address: closed}, err, time.Now()); p.Reason != ReasonKubeletNotRunning {
		t.Errorf("a closed port: %s: %s", p.Reason, p.Message)
	}
}

// The held connection ends when the kubelet's side closes it.
func TestHoldEndsWithTheKubelet(t *testing.T) {
	srv, ca := kubeletServer(t, metricsText)
	c, err := newKubeletClient(KubeletConfig{Address: srv.Listener.Addr().String(), CAFile: ca}, &rest.Config{}, "example.com", "/r")
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
	c, err := newKubeletClient(KubeletConfig{Address: srv.Listener.Addr().String(), CAFile: ca, RegistryDir: "/var/lib/kubelet/plugins_registry"},
		&rest.Config{}, "example.com", "/r")
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()

	serve.Store(&big)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	s, err := c.readMetrics(context.Background())
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.seen) != sockets || s.started.IsZero() {
		t.Errorf("%d sockets seen, started %v; want %d and the start time", len(s.seen), s.started, sockets)
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
