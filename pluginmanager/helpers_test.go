package pluginmanager_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	"google.golang.org/grpc"

	"github.com/plugd/plugd/internal/testenv"
	"github.com/plugd/plugd/plugin"
	"github.com/plugd/plugd/pluginmanager"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// wait is how long a test waits for something that should happen in
// milliseconds; it is generous because -race on two busy cores is slow.
const wait = 20 * time.Second

// harness is a running manager with a way to wait for its state.
type harness struct {
	t   *testing.T
	m   *pluginmanager.Manager
	dir string
	sub *pluginmanager.Subscription
}

// start runs a manager on dir (a fresh one if empty) with fast test timings,
// adds handlers by type, and stops it at the end of the test, checking that
// Run returned.
func start(t *testing.T, opts pluginmanager.Options, handlers map[string]pluginmanager.Handler) *harness {
	t.Helper()
	if opts.Dir == "" {
		opts.Dir = testenv.ShortDir(t, "pm")
	}
	if opts.BackoffInitial == 0 {
		opts.BackoffInitial = 20 * time.Millisecond
		opts.BackoffMax = 200 * time.Millisecond
	}
	m, err := pluginmanager.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	for typ, h := range handlers {
		m.AddHandler(typ, h)
	}
	h := &harness{t: t, m: m, dir: opts.Dir, sub: m.Subscribe()}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run returned %v", err)
			}
		case <-time.After(wait):
			t.Errorf("Run did not return within %s of cancellation", wait)
		}
	})
	return h
}

// until waits for cond to hold on the manager's snapshot, re-checking on every
// event, and fails the test at the deadline with the last snapshot.
func (h *harness) until(what string, cond func([]pluginmanager.PluginStatus) bool) []pluginmanager.PluginStatus {
	h.t.Helper()
	deadline := time.After(wait)
	for {
		snap := h.m.Plugins()
		if cond(snap) {
			return snap
		}
		select {
		case <-h.sub.Events():
		case <-deadline:
			h.t.Fatalf("timed out waiting for %s; plugins: %+v", what, snap)
		}
	}
}

// status waits for the socket at path to reach state, and returns its status.
func (h *harness) status(path string, state pluginmanager.State) pluginmanager.PluginStatus {
	h.t.Helper()
	var got pluginmanager.PluginStatus
	h.until(fmt.Sprintf("%s to be %s", filepath.Base(path), state), func(ps []pluginmanager.PluginStatus) bool {
		for _, p := range ps {
			if p.Socket == path && p.State == state {
				got = p
				return true
			}
		}
		return false
	})
	return got
}

// gone waits until the manager has forgotten path.
func (h *harness) gone(path string) {
	h.t.Helper()
	h.until(filepath.Base(path)+" to be forgotten", func(ps []pluginmanager.PluginStatus) bool {
		for _, p := range ps {
			if p.Socket == path {
				return false
			}
		}
		return true
	})
}

// startPlugin serves the registration service with the SDK and closes it at
// the end of the test.
func startPlugin(t *testing.T, cfg plugin.Config) *plugin.Server {
	t.Helper()
	s, err := plugin.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// told waits for the plugin's next status from the manager.
func told(t *testing.T, c <-chan plugin.Status) plugin.Status {
	t.Helper()
	select {
	case st := <-c:
		return st
	case <-time.After(wait):
		t.Fatal("timed out waiting for the manager to notify the plugin")
		return plugin.Status{}
	}
}

// statuses returns an OnStatus callback and the channel it feeds.
func statuses() (func(plugin.Status), <-chan plugin.Status) {
	c := make(chan plugin.Status, 100)
	return func(st plugin.Status) { c <- st }, c
}

// recorder is a handler that records its calls and answers as told.
type recorder struct {
	mu          sync.Mutex
	calls       []string // "validate name", "register name", "deregister name"
	validateErr func(p pluginmanager.Plugin) error
	registerErr func(p pluginmanager.Plugin) error
	registered  map[string]pluginmanager.Plugin // by socket
	changed     chan struct{}
}

func newRecorder() *recorder {
	return &recorder{registered: make(map[string]pluginmanager.Plugin), changed: make(chan struct{}, 1)}
}

func (r *recorder) record(call string) {
	r.calls = append(r.calls, call)
	select {
	case r.changed <- struct{}{}:
	default:
	}
}

func (r *recorder) Validate(_ context.Context, p pluginmanager.Plugin) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.record("validate " + p.Name)
	if r.validateErr != nil {
		return r.validateErr(p)
	}
	return nil
}

func (r *recorder) Register(_ context.Context, p pluginmanager.Plugin) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.record("register " + p.Name)
	if r.registerErr != nil {
		if err := r.registerErr(p); err != nil {
			return err
		}
	}
	r.registered[p.Socket] = p
	return nil
}

func (r *recorder) Deregister(_ context.Context, p pluginmanager.Plugin) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.record("deregister " + p.Name)
	delete(r.registered, p.Socket)
}

func (r *recorder) Calls() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.calls...)
}

func (r *recorder) count(call string) int {
	n := 0
	for _, c := range r.Calls() {
		if c == call {
			n++
		}
	}
	return n
}

// waitCalls waits until the recorder has seen call n times.
func (r *recorder) waitCalls(t *testing.T, call string, n int) {
	t.Helper()
	deadline := time.After(wait)
	for r.count(call) < n {
		select {
		case <-r.changed:
		case <-deadline:
			t.Fatalf("timed out waiting for %d× %q; calls: %q", n, call, r.Calls())
		}
	}
}

// staleSocket leaves a socket file at path with nobody listening, as a
// crashed plugin does.
func staleSocket(t *testing.T, path string) {
	t.Helper()
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	l.Close()
}

// serveRaw serves srv's services on a socket at path, for plugins the SDK will
// not let us write: hanging, lying or not serving Registration at all.
func serveRaw(t *testing.T, path string, register func(*grpc.Server), opts ...grpc.ServerOption) *grpc.Server {
	t.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(opts...)
	if register != nil {
		register(srv)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(l); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			t.Errorf("serve %s: %v", path, err)
		}
	}()
	t.Cleanup(func() {
		srv.Stop()
		<-done
	})
	return srv
}

// renameOver moves a socket into place over an old one, as a restarting
// plugin using the SDK does.
func renameOver(from, to string) error { return os.Rename(from, to) }

// statPath reports whether anything is at path.
func statPath(path string) (os.FileInfo, bool) {
	fi, err := os.Lstat(path)
	return fi, err == nil
}

// counterFrom reads a counter without labels from reg, as a collector.
func counterFrom(t *testing.T, reg *prometheus.Registry, name string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: name})
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.Metric) == 1 {
			c.Add(mf.Metric[0].GetCounter().GetValue())
		}
	}
	return c
}

// pollUntil is until for conditions no event announces (an observer's
// repeated looks at a plugin that keeps answering change no state): it looks
// at the snapshot every 10ms, and fails the test at the deadline.
func (h *harness) pollUntil(what string, cond func([]pluginmanager.PluginStatus) bool) {
	h.t.Helper()
	deadline := time.After(wait)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		snap := h.m.Plugins()
		if cond(snap) {
			return
		}
		select {
		case <-tick.C:
		case <-deadline:
			h.t.Fatalf("timed out waiting for %s; plugins: %+v", what, snap)
		}
	}
}
