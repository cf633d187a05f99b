package kubeletstate

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"k8s.io/client-go/rest"
	podresv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
	testclock "k8s.io/utils/clock/testing"

	"github.com/plugd/plugd/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// newTestWatch is a Watch of the kubelet c reads, on a fake clock, whose
// reads the test makes (w.read) or whose Run it starts.
func newTestWatch(t *testing.T, c *Client, cfg Config) (*Watch, *testclock.FakeClock) {
	t.Helper()
	clk := testclock.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	return NewWatch(c, cfg, clk, slog.New(slog.DiscardHandler), testMetrics(), func() {}), clk
}

func testMetrics() Metrics {
	return Metrics{Reads: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "reads"}, []string{"what", "result"}),
		Bytes: prometheus.NewCounter(prometheus.CounterOpts{Name: "bytes"})}
}

// live says the evidence is of a kubelet read now.
func live(ev Evidence) bool { return ev.Problem == nil && ev.Reading != nil }

// fakeKubelet is a kubelet's secure port on loopback (TLS, its own
// certificate in caFile) whose /metrics answer the test sets: a handler,
// swapped at will.
type fakeKubelet struct {
	srv    *httptest.Server
	addr   string
	caFile string
	h      atomic.Pointer[http.HandlerFunc]
}

func newFakeKubelet(t *testing.T, body string) *fakeKubelet {
	t.Helper()
	k := &fakeKubelet{}
	k.serve(body)
	srv, ca := tlsServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { (*k.h.Load())(w, r) }))
	k.srv, k.addr, k.caFile = srv, srv.Listener.Addr().String(), ca
	return k
}

// serve makes the kubelet answer body.
func (k *fakeKubelet) serve(body string) {
	k.handle(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, body) })
}

func (k *fakeKubelet) handle(h http.HandlerFunc) { k.h.Store(&h) }

// client is a Client of k, with cfg's other fields.
func (k *fakeKubelet) client(t *testing.T, cfg Config) (*Client, Config) {
	t.Helper()
	cfg.Address = k.addr
	if cfg.CAFile == "" && !cfg.InsecureSkipVerify {
		cfg.CAFile = k.caFile
	}
	if cfg.RegistryDir == "" {
		cfg.RegistryDir = "/var/lib/kubelet/plugins_registry"
	}
	c, err := NewClient(cfg, &rest.Config{BearerToken: "good"}, "example.com", "/r")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.close)
	return c, cfg
}

// metricsAt is metricsText with the kubelet's start at started.
func metricsAt(started time.Time) string {
	return strings.Replace(metricsText, "process_start_time_seconds 1.76722e+09", fmt.Sprintf("process_start_time_seconds %d", started.Unix()), 1)
}

// podResources is a kubelet's pod-resources service on a real unix socket,
// that counts the reads of the allocatable devices and answers with one
// device of vendor.example/gpu, or fails while fail is set.
type podResources struct {
	podresv1.UnimplementedPodResourcesListerServer
	calls atomic.Int64
	fail  atomic.Bool
}

func (p *podResources) GetAllocatableResources(context.Context, *podresv1.AllocatableResourcesRequest) (*podresv1.AllocatableResourcesResponse, error) {
	p.calls.Add(1)
	if p.fail.Load() {
		return nil, fmt.Errorf("the device manager is not ready")
	}
	return &podresv1.AllocatableResourcesResponse{Devices: []*podresv1.ContainerDevices{{ResourceName: "vendor.example/gpu", DeviceIds: []string{"gpu-0"}}}}, nil
}

func servePodResources(t *testing.T) (*podResources, string) {
	t.Helper()
	sock := filepath.Join(testenv.ShortDir(t, "podres"), "pod-resources.sock")
	pr := &podResources{}
	testenv.ServeGRPC(t, sock, func(s grpc.ServiceRegistrar) { podresv1.RegisterPodResourcesListerServer(s, pr) })
	return pr, sock
}

// Each way a read of the kubelet fails (docs/kubernetes.md, "the kubelet's
// own state" and "when the API server or the kubelet is down") gives the
// evidence a problem of its reason, which says what to do; a kubelet
// that is not running leaves no reading (it has registered nothing), any
// other trouble keeps the last one (kubenode then infers).
func TestWatchFailureModes(t *testing.T) {
	started := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).Add(-time.Hour)
	for _, tc := range []struct {
		name   string
		cfg    Config
		h      http.HandlerFunc
		reason string
		say    string
	}{
		{"forbidden", Config{}, func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "Forbidden (user=system:serviceaccount:plugd:plugd, verb=get, resource=nodes, subresource(s)=[metrics])", http.StatusForbidden)
		}, ReasonForbidden, `lacks the permission "get nodes/metrics"`},
		{"unauthorized", Config{}, func(w http.ResponseWriter, r *http.Request) { http.Error(w, "Unauthorized", http.StatusUnauthorized) },
			ReasonUnauthorized, "webhook authentication"},
		{"a certificate plugd cannot verify", Config{ServerName: "node-b"}, nil, ReasonTLS, "caFile"},
		{"an error page", Config{}, func(w http.ResponseWriter, r *http.Request) { http.Error(w, "boom", http.StatusInternalServerError) },
			ReasonBadAnswer, "500 Internal Server Error: boom"},
		{"no start time", Config{}, func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "# TYPE x gauge\nx 1\n") },
			ReasonBadAnswer, "no process_start_time_seconds"},
		{"not a gzip stream", Config{}, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Encoding", "gzip")
			fmt.Fprint(w, "plain text")
		}, ReasonBadAnswer, "gzip"},
		{"oversized", Config{}, func(w http.ResponseWriter, r *http.Request) {
			for range maxMetricsWire/(1<<20) + 1 {
				w.Write(make([]byte, 1<<20))
			}
		}, ReasonBadAnswer, "larger than 16 MiB as sent"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := newFakeKubelet(t, metricsAt(started))
			c, cfg := k.client(t, tc.cfg)
			w, clk := newTestWatch(t, c, cfg)
			w.read(context.Background(), clk.Now(), true, false)
			if ev := w.Evidence(); !live(ev) {
				if tc.reason != ReasonTLS {
					t.Fatalf("the kubelet not read: %+v", ev.Problem)
				}
			}
			if tc.h != nil {
				k.handle(tc.h)
			}
			clk.Step(time.Second)
			w.read(context.Background(), clk.Now(), true, false)
			ev := w.Evidence()
			if ev.Problem == nil || ev.Problem.Reason != tc.reason || !strings.Contains(ev.Problem.Message, tc.say) {
				t.Fatalf("problem %+v; want %s saying %q", ev.Problem, tc.reason, tc.say)
			}
			if tc.reason != ReasonTLS && (ev.Reading == nil || !ev.Reading.Started.Equal(started)) {
				t.Errorf("the last reading not kept: %+v", ev.Reading)
			}
			since := ev.Problem.Since
			clk.Step(time.Second)
			w.read(context.Background(), clk.Now(), true, false)
			if ev := w.Evidence(); !ev.Problem.Since.Equal(since) {
				t.Errorf("the same trouble again moved its start from %s to %s", since, ev.Problem.Since)
			}
		})
	}
}

// A kubelet that does not answer within the read's deadline is
// unreachable, and the problem says so.
func TestWatchNoAnswer(t *testing.T) {
	k := newFakeKubelet(t, metricsText)
	hang := make(chan struct{})
	defer close(hang)
	k.handle(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-hang:
		case <-r.Context().Done():
		}
	})
	c, cfg := k.client(t, Config{})
	c.timeout = 200 * time.Millisecond
	if err := c.buildTransport(c.rc); err != nil {
		t.Fatal(err)
	}
	w, clk := newTestWatch(t, c, cfg)
	w.read(context.Background(), clk.Now(), true, false)
	ev := w.Evidence()
	if ev.Problem == nil || ev.Problem.Reason != ReasonUnreachable || !strings.Contains(ev.Problem.Message, "does not answer") {
		t.Errorf("problem %+v; want %s", ev.Problem, ReasonUnreachable)
	}
}

// Nothing listening at the kubelet's address: the kubelet is not running,
// it has registered nothing (no reading, the runs of each path
// forgotten), and the next one starts afresh.
func TestWatchNotRunning(t *testing.T) {
	k := newFakeKubelet(t, metricsText)
	c, cfg := k.client(t, Config{})
	w, clk := newTestWatch(t, c, cfg)
	w.read(context.Background(), clk.Now(), true, false)
	if ev := w.Evidence(); !live(ev) || ev.PresentSince("/r/csi-reg.sock").IsZero() {
		t.Fatalf("the kubelet not read: %+v, %+v", ev.Problem, ev.Reading)
	}
	k.srv.Close()
	w.read(context.Background(), clk.Now(), true, false)
	ev := w.Evidence()
	if ev.Problem == nil || ev.Problem.Reason != ReasonNotRunning || ev.Reading != nil || !ev.PresentSince("/r/csi-reg.sock").IsZero() {
		t.Errorf("a closed port: problem %+v, reading %+v, present since %s", ev.Problem, ev.Reading, ev.PresentSince("/r/csi-reg.sock"))
	}
}

// A kubelet restart is a start time that moves: the evidence says
// Restarted, and what the reads showed of each path starts afresh.
func TestWatchKubeletRestart(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	k := newFakeKubelet(t, metricsAt(t0.Add(-time.Hour)))
	c, cfg := k.client(t, Config{})
	w, clk := newTestWatch(t, c, cfg)
	w.read(context.Background(), clk.Now(), true, false)
	first := w.Evidence().PresentSince("/r/csi-reg.sock")
	clk.Step(time.Minute)
	w.read(context.Background(), clk.Now(), true, false)
	if ev := w.Evidence(); ev.Restarted || !ev.PresentSince("/r/csi-reg.sock").Equal(first) {
		t.Fatalf("the same kubelet: restarted %v, present since %s; want %s", ev.Restarted, ev.PresentSince("/r/csi-reg.sock"), first)
	}
	k.serve(metricsAt(clk.Now()))
	clk.Step(time.Second)
	w.read(context.Background(), clk.Now(), true, false)
	ev := w.Evidence()
	if !ev.Restarted || !ev.Reading.Started.Equal(clk.Now().Add(-time.Second)) || !ev.PresentSince("/r/csi-reg.sock").Equal(clk.Now()) {
		t.Errorf("after a restart: restarted %v, started %s, present since %s; want the run from this read", ev.Restarted, ev.Reading.Started, ev.PresentSince("/r/csi-reg.sock"))
	}
	if ev.Credited("/r/csi-reg.sock", clk.Now().Add(-time.Minute)) != true || ev.Credited("/r/none.sock", t0) {
		t.Errorf("credited: a registration since the restart of a socket from before it is the socket's; a path not held is not")
	}
}

// A read cut off mid-way (the kubelet resets its connections a moment
// before its port refuses) is tried again after cutRetry, up to maxCuts
// times, before it counts.
func TestWatchCutOff(t *testing.T) {
	k := newFakeKubelet(t, metricsText)
	c, cfg := k.client(t, Config{})
	w, clk := newTestWatch(t, c, cfg)
	w.read(context.Background(), clk.Now(), true, false)
	k.handle(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "100000")
		fmt.Fprint(w, "# TYPE process_start_time_seconds gauge\n") // and the connection ends
	})
	for i := range maxCuts {
		clk.Step(time.Second)
		w.read(context.Background(), clk.Now(), true, false)
		if ev := w.Evidence(); !live(ev) {
			t.Fatalf("cut %d counted: %+v", i+1, ev.Problem)
		}
		metrics, _, next := w.due(clk.Now(), false)
		if metrics || !next.Equal(clk.Now().Add(cutRetry)) {
			t.Fatalf("cut %d: due %v, next %s; want a retry after %s", i+1, metrics, next.Sub(clk.Now()), cutRetry)
		}
	}
	clk.Step(cutRetry)
	w.read(context.Background(), clk.Now(), true, false)
	if ev := w.Evidence(); ev.Problem == nil {
		t.Errorf("the read after %d cuts did not count", maxCuts)
	}
}

// The reads are due at resync, at the wishes (Want: a read no later
// than), and at once when forced; a wish a read served is no wish any
// more.
func TestWatchDue(t *testing.T) {
	k := newFakeKubelet(t, metricsText)
	_, sock := servePodResources(t)
	c, cfg := k.client(t, Config{PodResources: sock, Resync: time.Minute})
	w, clk := newTestWatch(t, c, cfg)
	t0 := clk.Now()
	w.read(context.Background(), t0, true, true)
	for _, tc := range []struct {
		name                     string
		wantMetrics, wantDevices time.Duration // after t0; 0: none
		at                       time.Duration
		metrics, devices         bool
		next                     time.Duration
	}{
		{"just read", 0, 0, time.Second, false, false, time.Minute},
		{"resync", 0, 0, time.Minute, true, true, time.Minute},
		{"a wish of metrics", 250 * time.Millisecond, 0, 100 * time.Millisecond, false, false, 250 * time.Millisecond},
		{"a wish of metrics, due", 250 * time.Millisecond, 0, 250 * time.Millisecond, true, true, 250 * time.Millisecond},
		{"a wish of devices", 0, time.Second, 500 * time.Millisecond, false, false, time.Second},
		{"a wish of devices, due", 0, time.Second, time.Second, false, true, time.Second},
		{"a wish in the past, served", 0, -time.Second, time.Second, false, false, time.Minute},
	} {
		at := func(d time.Duration) time.Time {
			if d == 0 {
				return time.Time{}
			}
			return t0.Add(d)
		}
		w.Want(at(tc.wantMetrics), at(tc.wantDevices))
		metrics, devices, next := w.due(t0.Add(tc.at), false)
		if metrics != tc.metrics || devices != tc.devices || !next.Equal(t0.Add(tc.next)) {
			t.Errorf("%s: due %v %v, next %s; want %v %v, %s", tc.name, metrics, devices, next.Sub(t0), tc.metrics, tc.devices, tc.next)
		}
	}
	if m, d, _ := w.due(t0, true); !m || !d {
		t.Errorf("forced: metrics %v, devices %v", m, d)
	}
}

// Issue 33, item 4: while an expected device plugin has fewer healthy
// devices than minHealthyDevices, pod-resources is read once a
// devicesPoll, not at every minReadGap. The poll was anchored to the last
// read of the kubelet's metrics (up to a resync old), so its next read was
// always due: 9.9 reads a second. The test plays the watch's run on the
// fake clock (what is due, the gap, the read, kubenode's wish from the
// evidence, the next wake-up) and counts the calls the real gRPC server
// saw. (kubenode's TestDecide holds its wish: a second after the later of
// the two reads.)
func TestWatchDevicesPoll(t *testing.T) {
	k := newFakeKubelet(t, metricsText)
	pr, sock := servePodResources(t)
	c, cfg := k.client(t, Config{PodResources: sock})
	w, clk := newTestWatch(t, c, cfg)
	ctx := context.Background()
	w.read(ctx, clk.Now(), true, false)
	// kubenode's wish, from the evidence.
	wish := func() {
		ev := w.Evidence()
		w.Want(time.Time{}, latest(ev.Reading.At, ev.DevicesAt).Add(time.Second))
	}
	// A minute on: the metrics read is a minute old, as after any
	// quiet minute; then 10 s of the watch's run.
	clk.Step(time.Minute)
	wish()
	end := clk.Now().Add(10 * time.Second)
	for now := clk.Now(); now.Before(end); now = clk.Now() {
		metrics, devices, next := w.due(now, false)
		if metrics || devices {
			if gap := now.Sub(w.lastRead()); gap < minReadGap {
				clk.SetTime(now.Add(minReadGap - gap))
				continue
			}
			w.read(ctx, now, metrics, devices)
			wish() // onChange
			_, _, next = w.due(now, false)
		}
		if next.After(now) {
			clk.SetTime(next)
		}
	}
	// One at the start (the wish is already past), then one a second.
	if got, want := pr.calls.Load(), int64(10*time.Second/time.Second)+1; got < want-1 || got > want {
		t.Errorf("%d reads of pod-resources in 10 s; want %d, one a second", got, want)
	}
	if ev := w.Evidence(); ev.Reading.Devices["vendor.example/gpu"] != 1 || ev.Reading.DevicesErr != nil {
		t.Errorf("devices %v (%v)", ev.Reading.Devices, ev.Reading.DevicesErr)
	}
	// A read of the devices that fails keeps the count, and says why; the
	// evidence given before (which kubenode may be judging) stays as it
	// was.
	given := w.Evidence()
	pr.fail.Store(true)
	w.read(ctx, clk.Now(), false, true)
	if ev := w.Evidence(); ev.Reading.Devices["vendor.example/gpu"] != 1 || ev.Reading.DevicesErr == nil {
		t.Errorf("after a failed read: devices %v (%v)", ev.Reading.Devices, ev.Reading.DevicesErr)
	}
	if given.Reading.DevicesErr != nil {
		t.Errorf("a read of the devices changed the evidence given before it")
	}
	// A read of the metrics alone keeps the devices of the last.
	w.read(ctx, clk.Now(), true, false)
	if ev := w.Evidence(); ev.Reading.Devices["vendor.example/gpu"] != 1 {
		t.Errorf("a read of the metrics alone dropped the devices: %v", ev.Reading.Devices)
	}
}

// Run reads at its start, on Request (once minReadGap has passed since
// the last), on a wish, when the held connection ends (the kubelet's
// process went), and stops with its context.
func TestWatchRun(t *testing.T) {
	k := newFakeKubelet(t, metricsText)
	_, sock := servePodResources(t)
	c, cfg := k.client(t, Config{PodResources: sock})
	clk := testclock.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	reads := make(chan struct{}, 100)
	w := NewWatch(c, cfg, clk, slog.New(slog.DiscardHandler), testMetrics(), func() { reads <- struct{}{} })
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() { defer close(stopped); w.Run(ctx) }()
	defer func() {
		cancel()
		<-stopped
	}()
	// read waits for a read, stepping the fake clock by minReadGap while
	// none comes: Run's timer fires only on a step.
	read := func(what string) {
		t.Helper()
		deadline := time.After(testenv.Timeout)
		for {
			select {
			case <-reads:
				return
			case <-deadline:
				t.Fatalf("%s: no read within %v", what, testenv.Timeout)
			case <-time.After(10 * time.Millisecond):
				clk.Step(minReadGap)
			}
		}
	}
	drain := func() {
		for len(reads) > 0 {
			<-reads
		}
	}
	read("the start")
	if ev := w.Evidence(); !live(ev) {
		t.Fatalf("not read: %+v", ev.Problem)
	}
	drain()
	before := w.Evidence().Reads
	w.Request()
	read("a request")
	w.RequestDevices()
	read("a request of the devices")
	w.Want(clk.Now().Add(time.Second), time.Time{})
	read("a wish")
	k.srv.CloseClientConnections() // the kubelet's process went, and came back
	read("the held connection's end")
	if ev := w.Evidence(); ev.Reads <= before || !live(ev) {
		t.Errorf("reads %d (before %d), problem %+v", ev.Reads, before, ev.Problem)
	}
}

// The held connection is dialled again after a failure: after a refused
// one (the kubelet restarting) from holdRetryMin doubling up to
// holdRetryDown; after another (TLS) up to holdRetryMax. Each end asks for
// a read.
func TestWatchHoldRedials(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedAddr := l.Addr().String()
	l.Close()
	k := newFakeKubelet(t, metricsText)
	for _, tc := range []struct {
		name  string
		cfg   Config
		waits []time.Duration
	}{
		{"refused", Config{Address: closedAddr, CAFile: k.caFile}, []time.Duration{250 * time.Millisecond, 500 * time.Millisecond, time.Second, holdRetryDown, holdRetryDown}},
		{"TLS", Config{Address: k.addr, CAFile: k.caFile, ServerName: "node-b"}, []time.Duration{250 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second, 4 * time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := NewClient(tc.cfg, &rest.Config{}, "example.com", "/r")
			if err != nil {
				t.Fatal(err)
			}
			defer c.close()
			w, clk := newTestWatch(t, c, tc.cfg)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { defer close(done); w.holdLoop(ctx) }()
			defer func() { cancel(); <-done }()
			for i, wait := range tc.waits {
				select {
				case <-w.kick:
				case <-time.After(testenv.Timeout):
					t.Fatalf("dial %d: its end asked for no read", i+1)
				}
				waitWaiter(t, clk)
				clk.Step(wait - time.Millisecond)
				if !clk.HasWaiters() {
					t.Fatalf("dial %d: redialled before %s", i+2, wait)
				}
				clk.Step(time.Millisecond)
			}
		})
	}
}

// waitWaiter waits until a goroutine waits on clk.
func waitWaiter(t *testing.T, clk *testclock.FakeClock) {
	t.Helper()
	deadline := time.Now().Add(testenv.Timeout)
	for !clk.HasWaiters() {
		if time.Now().After(deadline) {
			t.Fatalf("nothing waits on the clock within %v", testenv.Timeout)
		}
		time.Sleep(time.Millisecond) // polling the fake clock's waiters
	}
}

// A kubelet that renamed its ALPHA metric (plugin_manager_total_plugins)
// serves /metrics without it: the reading says so (PluginMetric false), as
// does one whose plugin manager holds nothing. kubenode tells the two
// apart by the sockets it sees.
func TestReadingWithoutThePluginMetric(t *testing.T) {
	renamed := strings.ReplaceAll(metricsText, "plugin_manager_total_plugins", "plugin_manager_registered_plugins")
	for _, tc := range []struct {
		name, body string
		want       bool
	}{{"as today", metricsText, true}, {"renamed", renamed, false}} {
		k := newFakeKubelet(t, tc.body)
		c, cfg := k.client(t, Config{})
		w, clk := newTestWatch(t, c, cfg)
		w.read(context.Background(), clk.Now(), true, false)
		ev := w.Evidence()
		if !live(ev) || ev.Reading.PluginMetric != tc.want || tc.want != (len(ev.Reading.Seen) > 0) {
			t.Errorf("%s: problem %+v, plugin metric %v (want %v), seen %v", tc.name, ev.Problem, ev.Reading.PluginMetric, tc.want, ev.Reading.Seen)
		}
	}
}

// The record keeps, of each socket path, the runs of reads that showed
// it: registered since, retried since (seen, not registered), and the
// last registration dropped while the kubelet kept the path.
func TestRecordTracksRuns(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	const p = "/r/csi.sock"
	var rec Record
	read := func(at time.Duration, registered, seen bool) Evidence {
		r := Reading{At: t0.Add(at), Started: t0, Registered: map[string]bool{p: registered}, Seen: map[string]bool{p: seen}}
		rec.Read(r)
		return rec.Evidence()
	}
	read(0, false, true) // refused: the kubelet retries
	if ev := read(time.Second, true, true); !ev.PresentSince(p).Equal(t0.Add(time.Second)) || !ev.retrying[p].Equal(t0) {
		t.Errorf("registered: present since %s, retrying since %s", ev.PresentSince(p), ev.retrying[p])
	}
	if ev := read(2*time.Second, false, true); !ev.PresentSince(p).IsZero() || !ev.dropped[p].Equal(t0.Add(2*time.Second)) {
		t.Errorf("dropped: present since %s, dropped %s", ev.PresentSince(p), ev.dropped[p])
	}
	if ev := read(3*time.Second, false, false); len(ev.retrying)+len(ev.dropped) != 0 {
		t.Errorf("gone from the desired state: retrying %v, dropped %v", ev.retrying, ev.dropped)
	}
}

// The last line of an answer may lack its newline.
func TestMetricsWithoutFinalNewline(t *testing.T) {
	k := newFakeKubelet(t, strings.TrimSuffix(metricsText, "\n"))
	c, _ := k.client(t, Config{})
	s, err := c.readMetrics(context.Background())
	if err != nil || s.Started.IsZero() || len(s.Registered) != 1 {
		t.Errorf("reading %+v, %v", s, err)
	}
}
