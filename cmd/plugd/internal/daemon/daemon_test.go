package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/plugd/plugd/cmd/internal/version"
	"github.com/plugd/plugd/internal/confine"

	"github.com/spf13/pflag"
	"go.uber.org/goleak"

	"github.com/plugd/plugd/api"
	"github.com/plugd/plugd/internal/testenv"
	"github.com/plugd/plugd/plugin"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type running struct {
	d      *Daemon
	dir    string
	client *api.Client
	logs   *testenv.Buffer
}

// runDaemon starts a daemon on a fresh directory and waits until it is ready.
func runDaemon(t *testing.T, cfg Config) *running {
	t.Helper()
	base := testenv.ShortDir(t, "pd")
	if cfg.RegistryDir == "" {
		cfg.RegistryDir = filepath.Join(base, "reg")
	}
	if cfg.Status.Socket == "" {
		cfg.Status.Socket = filepath.Join(base, "plugd.sock")
	}
	logs := &testenv.Buffer{}
	d, err := New(cfg, logs)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(testenv.Timeout):
			t.Error("Run did not return after cancel")
		}
		if _, err := os.Lstat(cfg.Status.Socket); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("status socket left behind: %v", err)
		}
	})
	r := &running{d: d, dir: cfg.RegistryDir, client: &api.Client{Socket: cfg.Status.Socket}, logs: logs}
	select {
	case <-d.m.Synced():
	case <-time.After(testenv.Timeout):
		t.Fatal("daemon never scanned its directory")
	}
	return r
}

// waitFor waits for the plugin with id to reach state, watching the event stream.
func (r *running) waitFor(t *testing.T, id, state string) api.Plugin {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout)
	defer cancel()
	stream, err := r.client.Events(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	for {
		if p, err := r.client.Plugin(ctx, id); err == nil && p.State == state {
			return p
		}
		if _, err := stream.Next(); err != nil {
			p, _ := r.client.Plugin(context.Background(), id)
			t.Fatalf("waiting for %s to be %s: %v; it is %+v", id, state, err, p)
		}
	}
}

func TestStatusAPI(t *testing.T) {
	r := runDaemon(t, Config{})
	ctx := context.Background()
	testenv.StartPlugin(t, plugin.Config{Dir: r.dir, Socket: "csi.sock", Type: "CSIPlugin", Name: "csi.example.com", Versions: []string{"1.0.0"}})
	if err := os.Mkdir(filepath.Join(r.dir, "vendor"), 0o750); err != nil {
		t.Fatal(err)
	}
	testenv.StartPlugin(t, plugin.Config{Dir: filepath.Join(r.dir, "vendor"), Socket: "gpu.sock", Type: "DevicePlugin", Name: "example.com/gpu", Versions: []string{"v1beta1"}})
	testenv.StartPlugin(t, plugin.Config{Dir: r.dir, Socket: "odd.sock", Type: "example.com/Odd", Name: "odd", Versions: []string{"v1"}})

	csi := r.waitFor(t, "csi.sock", "Registered")
	if csi.Type != "CSIPlugin" || csi.Name != "csi.example.com" || csi.Endpoint != filepath.Join(r.dir, "csi.sock") || !csi.Newest || csi.RegisteredSince.IsZero() {
		t.Errorf("csi plugin = %+v", csi)
	}
	r.waitFor(t, "vendor/gpu.sock", "Registered")
	odd := r.waitFor(t, "odd.sock", "Rejected")
	if odd.Reason != "no_handler" || !strings.Contains(odd.LastError, "example.com/Odd") {
		t.Errorf("odd plugin = %+v", odd)
	}

	all, err := r.client.Plugins(ctx, api.Filter{})
	if err != nil || len(all) != 3 || all[0].ID != "csi.sock" || all[1].ID != "odd.sock" || all[2].ID != "vendor/gpu.sock" {
		t.Errorf("list = %+v, %v; want three, sorted by ID", all, err)
	}
	for _, tc := range []struct {
		f    api.Filter
		want int
	}{
		{api.Filter{Type: "DevicePlugin"}, 1},
		{api.Filter{State: "Registered"}, 2},
		{api.Filter{Name: "odd", State: "Rejected"}, 1},
		{api.Filter{Name: "nobody"}, 0},
	} {
		if got, err := r.client.Plugins(ctx, tc.f); err != nil || len(got) != tc.want {
			t.Errorf("filter %+v: %d plugins, %v; want %d", tc.f, len(got), err, tc.want)
		}
	}
	if _, err := r.client.Plugins(ctx, api.Filter{State: "Happy"}); err == nil || !strings.Contains(err.Error(), `state "Happy" is not one of`) || !strings.Contains(err.Error(), "HTTP 400") {
		t.Errorf("bad state filter: %v", err)
	}
	if _, err := r.client.Plugin(ctx, "nope.sock"); !errors.Is(err, api.ErrNotFound) || !strings.Contains(err.Error(), "GET /v1/plugins") {
		t.Errorf("unknown plugin: %v", err)
	}

	// The event stream replays what happened, in order, with no gaps.
	ectx, cancel := context.WithTimeout(ctx, testenv.Timeout)
	defer cancel()
	stream, err := r.client.Events(ectx, 100)
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	var seq uint64
	registered := map[string]bool{}
	for len(registered) < 2 {
		ev, err := stream.Next()
		if err != nil {
			t.Fatal(err)
		}
		if seq != 0 && ev.Seq != seq+1 {
			t.Errorf("event seq %d after %d", ev.Seq, seq)
		}
		seq = ev.Seq
		if ev.Type == "Registered" {
			registered[ev.Plugin.ID] = true
		}
	}

	v, err := r.client.Version(ctx)
	if err != nil || v.Version != version.String() || v.RegistryDir != r.dir {
		t.Errorf("version = %+v, %v", v, err)
	}
	if err := r.client.Ready(ctx); err != nil {
		t.Errorf("ready: %v", err)
	}

	body := get(t, r.client, "/metrics", http.StatusOK)
	for _, want := range []string{
		`plugd_plugins{state="Registered",type="CSIPlugin"} 1`,
		`plugd_plugins{state="Rejected",type="other"} 1`,
		`plugd_registration_failures_total{reason="no_handler",type="other"} 1`,
		"go_goroutines",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	get(t, r.client, "/healthz", http.StatusOK)
	if body := get(t, r.client, "/v2/nothing", http.StatusNotFound); !strings.Contains(body, `"error": "no such endpoint: GET /v2/nothing`) {
		t.Errorf("unknown endpoint answered %s", body)
	}
	if body := get(t, r.client, "/v1/events?replay=-3", http.StatusBadRequest); !strings.Contains(body, "replay") {
		t.Errorf("bad replay answered %s", body)
	}
}

// get fetches path over the client's socket and checks the status code.
func get(t *testing.T, c *api.Client, path string, status int) string {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", c.Socket)
		},
	}}
	resp, err := hc.Get("http://plugd" + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != status {
		t.Errorf("GET %s = %d %s, want %d", path, resp.StatusCode, b, status)
	}
	if ct := resp.Header.Get("Content-Type"); path != "/metrics" && ct != "application/json" {
		t.Errorf("GET %s Content-Type = %q", path, ct)
	}
	return string(b)
}

func TestReadyzBeforeTheFirstScan(t *testing.T) {
	d, err := New(Config{RegistryDir: testenv.ShortDir(t, "pd"), Status: StatusConfig{Socket: "none"}}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	w := httptest.NewRecorder()
	d.Handler().ServeHTTP(w, httptest.NewRequest("GET", "/readyz", nil))
	var e api.Error
	if w.Code != http.StatusServiceUnavailable || json.Unmarshal(w.Body.Bytes(), &e) != nil || !strings.Contains(e.Message, "not been scanned") {
		t.Errorf("/readyz before Run = %d %s", w.Code, w.Body)
	}
}

func TestConfigErrorsNameTheField(t *testing.T) {
	dir := testenv.ShortDir(t, "pd")
	for _, tc := range []struct {
		yaml, want string
	}{
		{"registryDir: /x\nworkrs: 3\n", "unknown key workrs: it is not a setting of plugd"},
		{"handlers:\n- type: CSIPlugin\n  handler: magic\n", `handlers[0].handler is "magic": it must be one of accept`},
		{"handlers:\n- handler: accept\n", "handlers[0].type is empty"},
		{"handlers:\n- {type: A, handler: accept}\n- {type: A, handler: accept}\n", `handlers[1].type: "A" has a handler already`},
		{"resyncInterval: soon\n", `"soon" (a duration is written like "30s" or "1m30s") into Go struct field Config.resyncInterval`},
		{"timeouts: {dial: abc}\n", "Config.timeouts.dial"},
		{"shutdownTimeout: 30\n", "30 (a duration is written like"},
		{"resyncInterval: 10ms\n", "resyncInterval is 10ms: it must be at least 1s"},
		{"policy: {allowedPeers: [{type: CSIPlugin}]}\n", "policy.allowedPeers[0] (CSIPlugin) lists no uids or gids"},
		{"policy: {allowedPeers: [{uids: [0]}]}\n", "policy.allowedPeers[0].type is empty"},
		{"policy: {endpointRoots: [relative/dir]}\n", `policy.endpointRoots[0] "relative/dir" is not an absolute path`},
		{"policy: {maxSockets: -1}\n", "policy.maxSockets is -1"},
		{"liveness: {unhealthyGrace: 1ns}\n", "liveness.unhealthyGrace is 1ns"},
		{"liveness: {probeInterval: often}\n", "Config.liveness.probeInterval"},
		{"backoff: {initial: 1m, max: 1s}\n", "backoff.max (1s) is less than backoff.initial (1m0s)"},
		{"timeouts: {dial: -1s}\n", "timeouts.dial is -1s"},
		{"workers: -2\n", "workers is -2"},
		{"status: {tcp: 0.0.0.0:9090}\n", "not a loopback address"},
		{"status: {tcp: nine}\n", "status.tcp is \"nine\": it must be host:port"},
		{"log: {format: xml}\n", `log.format is "xml": it must be text or json`},
		{"log: {level: loud}\n", `log.level is "loud"`},
		{"kubernetes: {}\n", "kubernetes.nodeName is empty"},
		{"kubernetes: {nodeName: n, disagreementGrace: -1s}\n", "kubernetes.disagreementGrace is -1s"},
		{"kubernetes: {nodeName: n, removeTaintWhenReady: x}\n", `kubernetes.removeTaintWhenReady "x": write it as KEY:EFFECT`},
		{"kubernetes: {nodeName: n, removeTaintWhenReady: 'k:NoSchedule'}\n", "expect lists no plugins"},
		{"kubernetes: {nodeName: n, removeTaintWhenReady: 'node.kubernetes.io/unschedulable:NoSchedule'}\n", "Kubernetes reserves"},
		{"kubernetes: {nodeNam: n}\n", "unknown key kubernetes.nodeNam: it is not a setting of plugd (misspelt, or of another version?); the keys there are "},
		{"expect: [{type: CSIPlugin, name: a}, {type: CSIPlugin, nmae: x}]\n", "unknown key expect[1].nmae"},
		{"log:\n  format: json\n  levle: x\n", "unknown key log.levle"},
		{"workers: 1\nworkers: 2\n", "is not valid YAML: unmarshal errors:\n  line 2: key \"workers\" already set in map"},
		{"expect: [{type: CSIPlugin}]\n", "expect[0]: type and name are both needed"},
		{"expect: [{type: CSIPlugin, name: a.example.com, minHealthyDevices: 2}]\n", "expect[0]: minHealthyDevices applies to DevicePlugin"},
		{"expect: [{type: CSIPlugin, name: a.example.com, condition: Ready}]\n", "the kubelet's"},
		{"expect: [{type: CSIPlugin, name: a.example.com}, {type: DRAPlugin, name: b.example.com, condition: a.example.com/CSIPluginReady}]\n", "expect[1]: condition a.example.com/CSIPluginReady is also expect[0]'s"},
		{"doctor: {kubeletRoots: [var/lib/kubelet]}\n", "doctor.kubeletRoots[0]"},
	} {
		path := filepath.Join(dir, "c.yaml")
		if err := os.WriteFile(path, []byte(tc.yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg, err := LoadConfig(path)
		if err == nil {
			_, err = cfg.WithDefaults()
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want it to say %q", tc.yaml, err, tc.want)
		}
	}
	if _, err := LoadConfig(filepath.Join(dir, "missing.yaml")); err == nil || !strings.Contains(err.Error(), "missing.yaml") {
		t.Errorf("missing file: %v", err)
	}
}

func TestFlagsOverrideTheFile(t *testing.T) {
	dir := testenv.ShortDir(t, "pd")
	path := filepath.Join(dir, "c.yaml")
	os.WriteFile(path, []byte("registryDir: /from/file\nworkers: 3\nlog: {level: warn}\nhandlers: [{type: X, handler: accept}]\n"), 0o600)
	var o options
	flags := pflag.NewFlagSet("plugd", pflag.ContinueOnError)
	o.bind(flags)
	if err := flags.Parse([]string{"--config", path, "--workers", "7", "--handler", "CSIPlugin=accept", "--handler", "Y=accept"}); err != nil {
		t.Fatal(err)
	}
	cfg, err := o.load(flags)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.RegistryDir != "/from/file" || cfg.Workers != 7 || cfg.Log.Level != "warn" ||
		len(cfg.Handlers) != 2 || cfg.Handlers[0].Type != "CSIPlugin" || cfg.Handlers[1].Type != "Y" {
		t.Errorf("config = %+v", cfg)
	}
	if cfg.ResyncInterval != Duration(30*time.Second) || cfg.ShutdownTimeout != Duration(10*time.Second) {
		t.Errorf("defaults not applied: %+v", cfg)
	}
}

// --kubernetes (or --kubeconfig, --node-name) turns the Kubernetes
// connection on; the node name comes from NODE_NAME unless set; expected
// plugins get their default conditions.
func TestKubernetesFromFlagsAndEnv(t *testing.T) {
	dir := testenv.ShortDir(t, "pd")
	path := filepath.Join(dir, "c.yaml")
	os.WriteFile(path, []byte("expect: [{type: DevicePlugin, name: vendor.example/gpu}]\n"), 0o600)
	load := func(env string, args ...string) (Config, error) {
		o := options{getenv: func(k string) string {
			if k == "NODE_NAME" {
				return env
			}
			return ""
		}}
		flags := pflag.NewFlagSet("plugd", pflag.ContinueOnError)
		o.bind(flags)
		if err := flags.Parse(append([]string{"--config", path}, args...)); err != nil {
			t.Fatal(err)
		}
		return o.load(flags)
	}
	cfg, err := load("node-a")
	if err != nil || cfg.Kubernetes != nil {
		t.Fatalf("without --kubernetes: %+v, %v; want no connection", cfg.Kubernetes, err)
	}
	if e := cfg.Expect[0]; e.Condition != "vendor.example/gpu-DevicePluginReady" || e.MinHealthyDevices != 1 {
		t.Errorf("expect defaults: %+v", e)
	}
	if cfg, err = load("node-a", "--kubernetes"); err != nil || cfg.Kubernetes.NodeName != "node-a" || cfg.Kubernetes.Kubeconfig != "" {
		t.Errorf("--kubernetes with NODE_NAME: %+v, %v", cfg.Kubernetes, err)
	}
	if cfg, err = load("node-a", "--kubeconfig", "/k", "--node-name", "node-b"); err != nil || cfg.Kubernetes.NodeName != "node-b" || cfg.Kubernetes.Kubeconfig != "/k" {
		t.Errorf("--kubeconfig --node-name: %+v, %v", cfg.Kubernetes, err)
	}
	if _, err = load("", "--kubernetes"); err == nil || !strings.Contains(err.Error(), "NODE_NAME") {
		t.Errorf("--kubernetes without a node name: %v", err)
	}
}

func TestReload(t *testing.T) {
	r := runDaemon(t, Config{})
	testenv.StartPlugin(t, plugin.Config{Dir: r.dir, Socket: "g.sock", Type: "example.com/Greeter", Name: "g", Versions: []string{"v1"}})
	r.waitFor(t, "g.sock", "Rejected")

	next := r.d.Config()
	next.Log.Level = "debug"
	next.Handlers = append(next.Handlers, HandlerConfig{Type: "example.com/Greeter", Handler: "accept"})
	next.Workers = 3
	next.Handlers = next.Handlers[1:] // CSIPlugin dropped: cannot be applied
	applied, restart, err := r.d.Reload(next)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(applied, "; ") != "log.level: info -> debug; handlers: added accept for example.com/Greeter" {
		t.Errorf("applied %q", applied)
	}
	if strings.Join(restart, "; ") != "handlers: CSIPlugin removed; workers: 128 -> 3" {
		t.Errorf("needs restart %q", restart)
	}
	// The new handler takes the plugin that was waiting for one.
	r.waitFor(t, "g.sock", "Registered")
	if !r.d.log.Enabled(context.Background(), -4) {
		t.Error("log level not lowered to debug")
	}

	bad := r.d.Config()
	bad.Log.Format = "xml"
	if _, _, err := r.d.Reload(bad); err == nil {
		t.Error("a bad configuration was accepted on reload")
	}
}

func TestStatusSocketInUseOrStale(t *testing.T) {
	r := runDaemon(t, Config{})
	// A second daemon on the same socket is refused, naming the problem.
	d2, err := New(Config{RegistryDir: r.dir, Status: StatusConfig{Socket: r.client.Socket}}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if err := d2.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "another plugd is running") {
		t.Errorf("second daemon: %v", err)
	}

	// A socket left by a plugd that died is replaced.
	stale := filepath.Join(testenv.ShortDir(t, "pd"), "stale.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: stale, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	l.Close()
	runDaemon(t, Config{Status: StatusConfig{Socket: stale}})
	fi, err := os.Stat(stale)
	if err != nil || fi.Mode().Perm() != 0o660 {
		t.Errorf("status socket: %v, mode %v; want 0660", err, fi.Mode().Perm())
	}
}

func TestStatusSocketDirectoryMustBePrivate(t *testing.T) {
	shared := testenv.ShortDir(t, "pd")
	if err := os.Chmod(shared, 0o777); err != nil {
		t.Fatal(err)
	}
	d, err := New(Config{RegistryDir: testenv.ShortDir(t, "pd"), Status: StatusConfig{Socket: filepath.Join(shared, "plugd.sock")}}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "writable by users other than its owner") {
		t.Errorf("Run with the status socket in a shared directory = %v", err)
	}
	long := filepath.Join(testenv.ShortDir(t, "pd"), strings.Repeat("s", 110)+".sock")
	d, err = New(Config{RegistryDir: testenv.ShortDir(t, "pd"), Status: StatusConfig{Socket: long}}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Run(context.Background()); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("at most %d here", confine.MaxPath)) {
		t.Errorf("Run with a long socket path = %v", err)
	}
}

func TestReadOnlyAPIAndBoundedStreams(t *testing.T) {
	r := runDaemon(t, Config{Status: StatusConfig{TCP: "127.0.0.1:0"}})
	w := httptest.NewRecorder()
	r.d.Handler().ServeHTTP(w, httptest.NewRequest("POST", "/v1/plugins", nil))
	if w.Code != http.StatusMethodNotAllowed || w.Header().Get("Allow") != "GET, HEAD" || !strings.Contains(w.Body.String(), "read-only") {
		t.Errorf("POST /v1/plugins = %d %q %s", w.Code, w.Header().Get("Allow"), w.Body)
	}

	// Streams beyond the limit are turned away, not buffered: once clients
	// took every stream, one more client gets none.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr := r.tcpAddr(t)
	// Three clients take their share, and as many others one each.
	for i := range 3 + reservedStreams {
		n := 1
		if i < 3 {
			n = maxClientStreams
		}
		if _, err := openStreams(t, ctx, clientFrom(addr, fmt.Sprintf("127.0.1.%d", i+2)), n); err != nil {
			t.Fatalf("client %d: %v", i+1, err)
		}
	}
	if _, err := r.client.Events(ctx, 0); !errors.Is(err, api.ErrBusy) || !strings.Contains(err.Error(), "too many event streams") {
		t.Errorf("stream %d: %v", maxStreams+1, err)
	}
}

// Issue 13, item 6: a client that holds streams it does not read cannot lock
// the others out. One client gets maxClientStreams, no more; another client
// (the readiness probe's plugctl on the unix socket) still gets its own.
func TestEventStreamsPerClient(t *testing.T) {
	r := runDaemon(t, Config{Status: StatusConfig{TCP: "127.0.0.1:0"}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	greedy := clientFrom(r.tcpAddr(t), "127.0.0.2")
	if n, err := openStreams(t, ctx, greedy, maxStreams); n != maxClientStreams || !errors.Is(err, api.ErrBusy) ||
		!strings.Contains(err.Error(), fmt.Sprintf("this client (address 127.0.0.2) has %d event streams open", maxClientStreams)) {
		t.Errorf("one client opened %d streams, then: %v; want %d, then a refusal that says why", n, err, maxClientStreams)
	}
	s, err := r.client.Events(ctx, 0)
	if err != nil {
		t.Fatalf("another client, after the first took its share: %v", err)
	}
	s.Close()
}

// Issue 25, item 7: clients that hold streams share fairly with those
// that hold none. Before, four clients (four uids in the status socket's
// group) took all 64 streams, and every plugctl watch after them failed.
// Now four greedy clients take at most 49, and 15 more clients (the last
// one on the unix socket, as a readiness probe's plugctl) get one each; a
// greedy client is told why it gets no more.
func TestEventStreamsShareFairly(t *testing.T) {
	r := runDaemon(t, Config{Status: StatusConfig{TCP: "127.0.0.1:0"}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr := r.tcpAddr(t)
	taken := 0
	for i := range 4 {
		src := fmt.Sprintf("127.0.0.%d", i+2)
		n, err := openStreams(t, ctx, clientFrom(addr, src), maxStreams)
		taken += n
		if !errors.Is(err, api.ErrBusy) || !strings.Contains(err.Error(), "this client (address "+src+") has") {
			t.Fatalf("greedy client %s: opened %d, then %v; want a refusal that says why", src, n, err)
		}
	}
	if max := maxStreams - reservedStreams + 1; taken > max {
		t.Errorf("four greedy clients took %d streams, more than %d", taken, max)
	}
	for i := range reservedStreams - 2 {
		src := fmt.Sprintf("127.0.2.%d", i+2)
		if _, err := openStreams(t, ctx, clientFrom(addr, src), 1); err != nil {
			t.Errorf("client %d with no stream after the greedy ones: %v", i+1, err)
		}
	}
	if _, err := openStreams(t, ctx, r.client, 1); err != nil {
		t.Errorf("the unix socket's client after the greedy ones: %v", err)
	}
	// Every stream is taken now: one client more is told so.
	if _, err := openStreams(t, ctx, clientFrom(addr, "127.0.3.2"), 1); !errors.Is(err, api.ErrBusy) || !strings.Contains(err.Error(), "too many event streams") {
		t.Errorf("a client once every stream is taken: %v", err)
	}
}

// openStreams opens up to n event streams with c, which stay open until ctx
// ends, and returns how many it opened and the error that stopped it.
func openStreams(t *testing.T, ctx context.Context, c *api.Client, n int) (int, error) {
	t.Helper()
	for i := range n {
		s, err := c.Events(ctx, 0)
		if err != nil {
			return i, err
		}
		t.Cleanup(func() { s.Close() })
	}
	return n, nil
}

// tcpAddr is the address plugd's status API listens on over TCP, as it logs it.
func (r *running) tcpAddr(t *testing.T) string {
	t.Helper()
	m := regexp.MustCompile(`msg="serving the status API" address=(127\.0\.0\.1:\d+)`).FindStringSubmatch(r.logs.String())
	if m == nil {
		t.Fatalf("plugd did not log a TCP address:\n%s", r.logs)
	}
	return m[1]
}

// clientFrom is a client of the status API at addr that connects from the
// loopback address src: plugd sees each src as a client of its own.
func clientFrom(addr, src string) *api.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	return &api.Client{Address: "http://" + addr, HTTPClient: &http.Client{
		Transport: &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true}}}
}

func TestHandlersByNameWithDetails(t *testing.T) {
	r := runDaemon(t, Config{Handlers: []HandlerConfig{
		{Type: "example.com/Greeter", Handler: "hook", Hook: &HookConfig{
			Command: []string{"/bin/sh", "-c", `echo "welcome $PLUGD_PLUGIN_NAME" >&2`},
		}},
		{Type: "DevicePlugin", Handler: "deviceplugin", GracePeriod: Duration(time.Second)},
		{Type: "CSIPlugin", Handler: "csi"},
		{Type: "DRAPlugin", Handler: "dra"},
	}})
	testenv.StartPlugin(t, plugin.Config{Dir: r.dir, Socket: "g.sock", Type: "example.com/Greeter", Name: "g", Versions: []string{"v1"}})
	p := r.waitFor(t, "g.sock", "Registered")
	details, _ := p.Details.(map[string]any)
	if details["event"] != "register" || details["result"] != "accepted" || !strings.Contains(fmt.Sprint(details["output"]), "welcome g") {
		t.Errorf("details of a plugin the hook accepted = %#v", p.Details)
	}
	// A device plugin that serves no device service is refused by the real
	// handler, with its reason.
	testenv.StartPlugin(t, plugin.Config{Dir: r.dir, Socket: "gpu.sock", Type: "DevicePlugin", Name: "example.com/gpu", Versions: []string{"v1beta1"}})
	if p := r.waitFor(t, "gpu.sock", "Rejected"); !strings.Contains(p.LastError, "Unimplemented") && !strings.Contains(p.LastError, "device") {
		t.Errorf("device plugin without a device service: %+v", p)
	}
	body := get(t, r.client, "/metrics", http.StatusOK)
	if !strings.Contains(body, `plugd_hook_runs_total{event="register",plugin_type="example.com/Greeter",result="accepted"} 1`) {
		t.Errorf("/metrics lacks the hook's run, with its plugin type:\n%s", grep(body, "plugd_hook_runs_total"))
	}
}

func grep(text, substr string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func TestHandlerSettingsAreChecked(t *testing.T) {
	for _, tc := range []struct {
		h    HandlerConfig
		want string
	}{
		{HandlerConfig{Type: "X", Handler: "hook"}, "handlers[0]: handler hook needs hook:"},
		{HandlerConfig{Type: "X", Handler: "hook", Hook: &HookConfig{}}, "handlers[0]: hook: set exactly one of command or url"},
		{HandlerConfig{Type: "X", Handler: "hook", Hook: &HookConfig{Command: []string{"/no/such/program"}}}, "handlers[0]: hook: command[0]"},
		{HandlerConfig{Type: "X", Handler: "accept", Hook: &HookConfig{URL: "http://127.0.0.1:1"}}, "hook is set, but the handler is accept"},
		{HandlerConfig{Type: "X", Handler: "csi", GracePeriod: Duration(time.Second)}, "gracePeriod applies to the dra and deviceplugin handlers, not csi"},
	} {
		_, err := Config{RegistryDir: "/x", Handlers: []HandlerConfig{tc.h}}.WithDefaults()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.h, err, tc.want)
		}
	}
}

func TestPolicyAndLivenessFromFlags(t *testing.T) {
	var o options
	flags := pflag.NewFlagSet("plugd", pflag.ContinueOnError)
	o.bind(flags)
	if err := flags.Parse([]string{"--registry-dir", "/r", "--allowed-peer", "CSIPlugin=uid:0,gid:10", "--allowed-peer", "*=uid:0",
		"--endpoint-root", "/var/lib/kubelet/plugins", "--probe-interval", "5s", "--unhealthy-grace", "1m", "--max-sockets", "50"}); err != nil {
		t.Fatal(err)
	}
	cfg, err := o.load(flags)
	if err != nil {
		t.Fatal(err)
	}
	mo := cfg.managerOptions(nil, nil)
	if p := cfg.handlerOptions(HandlerConfig{Type: "CSIPlugin"}).AllowedPeers; p == nil || !slices.Equal(p.UIDs, []uint32{0}) || !slices.Equal(p.GIDs, []uint32{10}) {
		t.Errorf("CSIPlugin peers = %+v", p)
	}
	if p := cfg.handlerOptions(HandlerConfig{Type: "DevicePlugin"}).AllowedPeers; p != nil {
		t.Errorf("DevicePlugin peers = %+v, want none of its own: the manager's (the * rule)", p)
	}
	if p := mo.AllowedPeers; p == nil || !slices.Equal(p.UIDs, []uint32{0}) || mo.ProbeInterval != 5*time.Second || mo.UnhealthyGrace != time.Minute ||
		mo.MaxSockets != 50 || !slices.Equal(mo.EndpointRoots, []string{"/var/lib/kubelet/plugins"}) {
		t.Errorf("manager options = %+v", mo)
	}
	if err := flags.Parse([]string{"--allowed-peer", "CSIPlugin=root"}); err == nil {
		if _, err := o.load(flags); err == nil || !strings.Contains(err.Error(), "TYPE=uid:N,gid:M") {
			t.Errorf("bad --allowed-peer: %v", err)
		}
	}
}

// GET /v1/findings runs the doctor on what the daemon knows: here a plugin
// whose versions the kubelet would refuse, and an expected one that is
// missing. No Kubernetes is needed.
func TestFindings(t *testing.T) {
	r := runDaemon(t, Config{Expect: []ExpectConfig{{Type: "CSIPlugin", Name: "missing.example.com"}},
		Doctor: DoctorConfig{KubeletRoots: []string{"/nonexistent"}}})
	testenv.StartPlugin(t, plugin.Config{Dir: r.dir, Socket: "old.sock", Type: "DevicePlugin", Name: "example.com/gpu", Versions: []string{"v1alpha"}})
	r.waitFor(t, "old.sock", "Registered")
	fs, err := r.client.Findings(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var checks []string
	for _, f := range fs {
		checks = append(checks, f.Check+" "+f.Name)
	}
	if !slices.Contains(checks, "expected-missing missing.example.com") || !slices.Contains(checks, "versions-refused example.com/gpu") {
		t.Errorf("findings: %q", checks)
	}
	if p, _ := r.client.Plugin(context.Background(), "old.sock"); p.Kubelet != nil {
		t.Errorf("a plugin has a kubelet view without Kubernetes: %+v", p.Kubelet)
	}
}

// With an API server that does not answer, everything local works: plugins
// register, the status API serves them, their kubelet view says why it is
// Unknown, the doctor lists the trouble, and Run stops cleanly (goleak
// checks that the informers stopped too).
func TestKubernetesUnreachable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nobody listens there now: connections are refused
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	os.WriteFile(kubeconfig, []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://%s", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`, addr)), 0o600)
	r := runDaemon(t, Config{Kubernetes: &KubernetesConfig{Kubeconfig: kubeconfig, NodeName: "node-a", Kubelet: KubeletAccessConfig{Address: "none"}},
		Expect: []ExpectConfig{{Type: "CSIPlugin", Name: "csi.example.com"}}, Doctor: DoctorConfig{ProcDir: "none"}})
	testenv.StartPlugin(t, plugin.Config{Dir: r.dir, Socket: "csi.sock", Type: "CSIPlugin", Name: "csi.example.com", Versions: []string{"1.0.0"}})
	r.waitFor(t, "csi.sock", "Registered")
	deadline := time.Now().Add(testenv.Timeout)
	for {
		p, err := r.client.Plugin(context.Background(), "csi.sock")
		if err != nil {
			t.Fatal(err)
		}
		if k := p.Kubelet; k != nil && k.State == api.KubeletUnknown && k.Reason == "APIUnavailable" {
			if !strings.Contains(k.Message, "connection refused") {
				t.Errorf("kubelet view: %+v", k)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("kubelet view: %+v", p.Kubelet)
		}
		time.Sleep(10 * time.Millisecond) // the poll's pace: a view has no event
	}
	fs, err := r.client.Findings(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var api []string
	for _, f := range fs {
		if f.Check == "kubernetes-api" {
			api = append(api, f.Summary)
		}
	}
	if len(api) != 3 {
		t.Errorf("kubernetes-api findings: %q; want one per read (Node, CSINode, ResourceSlices)", api)
	}
	if n := strings.Count(r.logs.String(), "Kubernetes API: cannot read"); n != 3 {
		t.Errorf("logged the trouble %d times, want once per read:\n%s", n, r.logs)
	}
}

// A handler entry's liveness settings reach the manager; a configuration
// written before them (a 10s or disabled probe) still loads.
func TestHandlerLivenessSettings(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "plugd.yaml")
	if err := os.WriteFile(path, []byte(`registryDir: /r
liveness: {probeInterval: -1s, unhealthyGrace: 30s}
handlers:
  - {type: CSIPlugin, handler: csi, probeInterval: 10m}
  - {type: DevicePlugin, handler: deviceplugin, probeInterval: 10s, deregisterWithRegistrar: true}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := LoadConfig(path)
	if err == nil {
		cfg, err = cfg.WithDefaults()
	}
	if err != nil {
		t.Fatal(err)
	}
	if mo := cfg.managerOptions(nil, nil); mo.ProbeInterval >= 0 {
		t.Errorf("liveness.probeInterval -1s: the manager's is %s, want probes off", mo.ProbeInterval)
	}
	if ho := cfg.handlerOptions(cfg.Handlers[0]); ho.ProbeInterval != 10*time.Minute || ho.DeregisterWithRegistrar {
		t.Errorf("CSIPlugin: %+v", ho)
	}
	if ho := cfg.handlerOptions(cfg.Handlers[1]); ho.ProbeInterval != 10*time.Second || !ho.DeregisterWithRegistrar {
		t.Errorf("DevicePlugin: %+v", ho)
	}
}

// The status API's connections are a quarter of plugd's file descriptors, at
// least 16 and at most 256, shared by its listeners.
func TestStatusConnLimit(t *testing.T) {
	for _, tc := range []struct {
		nofile    uint64
		listeners int
		want      int
	}{
		{1024, 1, 256}, {1024, 2, 128}, {512, 1, 128}, {40, 1, 16}, {40, 2, 8},
		{1 << 20, 2, 128}, {0, 1, 256},
	} {
		if got := statusConnLimit(tc.nofile, tc.listeners); got != tc.want {
			t.Errorf("statusConnLimit(%d, %d) = %d, want %d", tc.nofile, tc.listeners, got, tc.want)
		}
	}
}

// Issue 25, item 10: plugd --help says each thing whole, and the start line
// names the handlers as a person writes them. Before, the text of
// --allow-writable-registry-dir stopped mid-sentence, --handler named only
// accept of the built-in handlers, and the start line printed Go structs.
func TestHelpAndStartLine(t *testing.T) {
	cmd := Command()
	var out strings.Builder
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"--help"})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"and the directories below it that are writable by others or another user's; without it, the registry directory is refused and such directories below it are left out\n",
		"the built-in HANDLER: accept, csi, dra, deviceplugin (hook needs --config, for its command or URL)",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("plugd --help does not say %q:\n%s", want, out.String())
		}
	}

	r := runDaemon(t, Config{Handlers: []HandlerConfig{{Type: "CSIPlugin", Handler: "csi"}, {Type: "example.com/Greeter", Handler: "accept"}}})
	r.logs.Wait(t, "plugd started", testenv.Timeout)
	if logs := r.logs.String(); !strings.Contains(logs, `handlers="CSIPlugin=csi, example.com/Greeter=accept"`) || strings.Contains(logs, "{Type:") {
		t.Errorf("the start line does not name the handlers as TYPE=HANDLER:\n%s", logs)
	}
}
