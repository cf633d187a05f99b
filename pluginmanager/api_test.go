package pluginmanager_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/plugd/plugd/internal/testenv"
	"github.com/plugd/plugd/plugin"
	"github.com/plugd/plugd/pluginmanager"
	"github.com/plugd/plugd/plugintest"
)

func TestOptionsErrorsNameTheField(t *testing.T) {
	for _, tc := range []struct {
		opts pluginmanager.Options
		want string
	}{
		{pluginmanager.Options{}, "Options.Dir is required"},
		{pluginmanager.Options{Dir: "x", Workers: -1}, "Options.Workers is -1"},
		{pluginmanager.Options{Dir: "x", DialTimeout: -time.Second}, "Options.DialTimeout is -1s"},
		{pluginmanager.Options{Dir: "x", BackoffInitial: time.Minute, BackoffMax: time.Second}, "Options.BackoffMax (1s) is less than Options.BackoffInitial (1m0s)"},
	} {
		_, err := pluginmanager.New(tc.opts)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%+v) = %v, want an error saying %q", tc.opts, err, tc.want)
		}
	}
}

func TestRunOnlyOnce(t *testing.T) {
	m, err := pluginmanager.New(pluginmanager.Options{Dir: testenv.ShortDir(t, "pm")})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := m.Run(ctx); err != nil {
		t.Fatalf("first Run = %v", err)
	}
	if err := m.Run(ctx); err == nil || !strings.Contains(err.Error(), "only once") {
		t.Errorf("second Run = %v, want an error", err)
	}
}

func TestAddHandlerPanicsOnMisuse(t *testing.T) {
	m, err := pluginmanager.New(pluginmanager.Options{Dir: testenv.ShortDir(t, "pm")})
	if err != nil {
		t.Fatal(err)
	}
	m.AddHandler("CSIPlugin", pluginmanager.HandlerFuncs{})
	for name, f := range map[string]func(){
		"empty type": func() { m.AddHandler("", pluginmanager.HandlerFuncs{}) },
		"nil":        func() { m.AddHandler("X", nil) },
		"twice":      func() { m.AddHandler("CSIPlugin", pluginmanager.HandlerFuncs{}) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: AddHandler did not panic", name)
				}
			}()
			f()
		}()
	}
}

// kubeletStyle is a handler written against the kubelet's interface.
type kubeletStyle struct {
	mu    sync.Mutex
	calls []string
	tmo   *time.Duration
	ctx   context.Context // RegisterPlugin's
}

func (k *kubeletStyle) ValidatePlugin(_ context.Context, name, endpoint string, versions []string) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.calls = append(k.calls, "validate "+name+" "+strings.Join(versions, ","))
	if name == "refused" {
		return errors.New("not on the list")
	}
	return nil
}

func (k *kubeletStyle) RegisterPlugin(ctx context.Context, name, endpoint string, versions []string, timeout *time.Duration) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.calls = append(k.calls, "register "+name)
	k.tmo, k.ctx = timeout, ctx
	return nil
}

func (k *kubeletStyle) DeRegisterPlugin(_ context.Context, name, endpoint string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.calls = append(k.calls, "deregister "+name)
}

// A kubelet handler is called as the kubelet calls it: a nil client
// timeout, a context that outlives the call and ends with the manager, and
// a refusal retried with backoff rather than final.
func TestKubeletHandlerAdapter(t *testing.T) {
	k := &kubeletStyle{}
	clk := fakeClock()
	h := start(t, pluginmanager.Options{HandlerTimeout: 7 * time.Second, Clock: clk}, map[string]pluginmanager.Handler{"DevicePlugin": pluginmanager.KubeletHandler(k)})
	p := testenv.StartPlugin(t, plugin.Config{Dir: h.dir, Socket: "gpu.sock", Type: "DevicePlugin", Name: "example.com/gpu", Versions: []string{"v1beta1"}})
	h.WaitSocket(p.Path(), pluginmanager.StateRegistered)
	refused := testenv.StartPlugin(t, plugin.Config{Dir: h.dir, Type: "DevicePlugin", Name: "refused"})
	// Its event, not its state: WaitSocket could return before the event
	// of the refusal comes, which the WaitEvent below would then take for
	// the retry's.
	ev := h.WaitEvent(refused.Path(), pluginmanager.EventFailed)
	if ev.Reason != pluginmanager.ReasonValidate || ev.Error != "not on the list" || ev.NextRetry.IsZero() {
		t.Errorf("refusal = %+v, want Failed, retried", ev)
	}
	clk.Step(time.Second) // past the retry
	h.WaitEvent(refused.Path(), pluginmanager.EventFailed)
	p.Close()
	h.WaitGone(p.Path())

	k.mu.Lock()
	want := []string{"validate example.com/gpu v1beta1", "register example.com/gpu", "validate refused v1", "validate refused v1", "deregister example.com/gpu"}
	if !slices.Equal(k.calls, want) {
		t.Errorf("calls = %q, want %q", k.calls, want)
	}
	if k.tmo != nil {
		t.Errorf("RegisterPlugin timeout = %v, want nil, as the kubelet passes", *k.tmo)
	}
	ctx := k.ctx
	k.mu.Unlock()
	if _, ok := ctx.Deadline(); ok || ctx.Err() != nil {
		t.Errorf("RegisterPlugin's context has a deadline or ended with the call: %v", ctx.Err())
	}
	h.Stop()
	if ctx.Err() == nil {
		t.Error("RegisterPlugin's context outlived the manager")
	}
}

// kubeletCSI refuses a second socket of a driver it has, as the kubelet's
// CSI handler does (the version is not higher), and deregisters by name.
type kubeletCSI struct {
	mu      sync.Mutex
	drivers map[string]string // name: endpoint
}

func (k *kubeletCSI) ValidatePlugin(_ context.Context, name, endpoint string, versions []string) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if _, ok := k.drivers[name]; ok {
		return fmt.Errorf("validation failed for CSI driver %s at endpoint %s: a driver of that name is already registered with a version not lower", name, endpoint)
	}
	return nil
}

func (k *kubeletCSI) RegisterPlugin(_ context.Context, name, endpoint string, versions []string, _ *time.Duration) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.drivers[name] = endpoint
	return nil
}

func (k *kubeletCSI) DeRegisterPlugin(_ context.Context, name, endpoint string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.drivers, name)
}

// Two registrars of one CSI driver (a rolling update that gives the new one
// its own socket): the kubelet's handler refuses the second while the first
// is registered. Retried, the second registers once the first has gone, so
// the node is not left without the driver.
func TestKubeletCSISecondSocketRegistersOnceTheFirstGoes(t *testing.T) {
	k := &kubeletCSI{drivers: map[string]string{}}
	h := start(t, pluginmanager.Options{}, map[string]pluginmanager.Handler{"CSIPlugin": pluginmanager.KubeletHandler(k)})
	first := testenv.StartPlugin(t, plugin.Config{Dir: h.dir, Socket: "csi-old.sock", Type: "CSIPlugin", Name: "csi.example.com", Versions: []string{"1.0.0"}})
	h.WaitSocket(first.Path(), pluginmanager.StateRegistered)
	second := testenv.StartPlugin(t, plugin.Config{Dir: h.dir, Socket: "csi-new.sock", Type: "CSIPlugin", Name: "csi.example.com", Versions: []string{"1.0.0"}})
	if s := h.WaitSocket(second.Path(), pluginmanager.StateFailed); s.Reason != pluginmanager.ReasonValidate {
		t.Fatalf("the second socket: %+v, want refused and retried", s)
	}
	first.Close()
	h.WaitGone(first.Path())
	h.WaitSocket(second.Path(), pluginmanager.StateRegistered)
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.drivers["csi.example.com"] == "" {
		t.Error("the node is left without the CSI driver")
	}
}

// A kubelet CSI handler wrapped with KubeletHandler, whose registrar dies
// while its driver serves (issue 25, item 10): as its doc says, it is
// deregistered at the end of its grace period, which the kubelet would not
// do; added with a negative grace, it stays registered (Unhealthy) until its
// socket goes, as with the kubelet.
func TestKubeletHandlerKeptWhileItsSocketStays(t *testing.T) {
	const grace = 30 * time.Second
	for _, tc := range []struct {
		name  string
		grace time.Duration
		kept  bool
	}{{"default grace", grace, false}, {"negative grace", -1, true}} {
		t.Run(tc.name, func(t *testing.T) {
			k := &kubeletCSI{drivers: map[string]string{}}
			clk := fakeClock()
			var logs testenv.Buffer
			h := start(t, pluginmanager.Options{Clock: clk, UnhealthyGrace: grace,
				Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))}, nil)
			h.m.AddHandler("CSIPlugin", pluginmanager.KubeletHandler(k), pluginmanager.HandlerOptions{UnhealthyGrace: tc.grace})
			path := filepath.Join(h.dir, "csi.sock")
			kill := serveLeaving(t, path, &moody{info: &registerapi.PluginInfo{Type: "CSIPlugin", Name: "csi.example.com", SupportedVersions: []string{"1.0.0"}}})
			h.WaitSocket(path, pluginmanager.StateRegistered)
			kill() // node-driver-registrar dies; its socket stays
			h.WaitEvent(path, pluginmanager.EventUnhealthy)
			if !tc.kept {
				clk.Step(grace)
				h.WaitEvent(path, pluginmanager.EventDeregistered)
			} else {
				// Looked at again an hour on, it is still Unhealthy, and
				// still registered.
				still := strings.Count(logs.String(), "plugin still unhealthy")
				clk.Step(time.Hour)
				logs.WaitN(t, "plugin still unhealthy", still+1, testenv.Timeout)
				if s, _ := plugintest.Find(h.m.Plugins(), path); s.State != pluginmanager.StateUnhealthy {
					t.Errorf("an hour after its registrar died: %s, want Unhealthy, still registered", s.State)
				}
			}
			k.mu.Lock()
			has := k.drivers["csi.example.com"] != ""
			k.mu.Unlock()
			if has != tc.kept {
				t.Errorf("the kubelet handler has the driver: %t, want %t", has, tc.kept)
			}
			if tc.kept {
				os.Remove(path) // its socket goes: let go then
				h.WaitEvent(path, pluginmanager.EventDeregistered)
			}
		})
	}
}

func TestMetrics(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	h := start(t, pluginmanager.Options{Registerer: reg}, map[string]pluginmanager.Handler{"CSIPlugin": plugintest.NewRecorder()})
	ok := testenv.StartPlugin(t, plugin.Config{Dir: h.dir, Type: "CSIPlugin", Name: "ok"})
	h.WaitSocket(ok.Path(), pluginmanager.StateRegistered)
	// A type with no handler is counted under "other", whatever the plugin calls it.
	odd := testenv.StartPlugin(t, plugin.Config{Dir: h.dir, Type: "made-up-type-1234", Name: "odd"})
	h.WaitSocket(odd.Path(), pluginmanager.StateRejected)

	expected := `
# HELP plugd_plugins Registration sockets known to the manager, by plugin type and state.
# TYPE plugd_plugins gauge
plugd_plugins{state="Failed",type="CSIPlugin"} 0
plugd_plugins{state="Pending",type="CSIPlugin"} 0
plugd_plugins{state="Registered",type="CSIPlugin"} 1
plugd_plugins{state="Registering",type="CSIPlugin"} 0
plugd_plugins{state="Rejected",type="CSIPlugin"} 0
plugd_plugins{state="Rejected",type="other"} 1
plugd_plugins{state="Stale",type="CSIPlugin"} 0
plugd_plugins{state="Unhealthy",type="CSIPlugin"} 0
# HELP plugd_registration_attempts_total Registration attempts started.
# TYPE plugd_registration_attempts_total counter
plugd_registration_attempts_total 2
# HELP plugd_registration_failures_total Registration attempts that failed, by plugin type and the step that failed.
# TYPE plugd_registration_failures_total counter
plugd_registration_failures_total{reason="no_handler",type="other"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(expected),
		"plugd_plugins", "plugd_registration_attempts_total", "plugd_registration_failures_total"); err != nil {
		t.Error(err)
	}
	if n, err := testutil.GatherAndCount(reg, "plugd_registration_latency_seconds"); err != nil || n != 1 {
		t.Errorf("latency series = %d, %v; want one, for CSIPlugin", n, err)
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Errorf("metric lint: %v %+v", err, problems)
	}

	// Registering twice on one registry is refused, naming the problem.
	if _, err := pluginmanager.New(pluginmanager.Options{Dir: h.dir, Registerer: reg}); err == nil || !strings.Contains(err.Error(), "registering metrics") {
		t.Errorf("second manager on one registry: %v", err)
	}
}

func TestSlowSubscriberIsToldItLostEvents(t *testing.T) {
	h := start(t, pluginmanager.Options{EventBuffer: 2}, map[string]pluginmanager.Handler{"CSIPlugin": plugintest.NewRecorder()})
	slow := h.m.Subscribe() // never read until the end
	defer slow.Close()
	for _, name := range []string{"a", "b", "c"} {
		p := testenv.StartPlugin(t, plugin.Config{Dir: h.dir, Type: "CSIPlugin", Name: name})
		h.WaitSocket(p.Path(), pluginmanager.StateRegistered)
	}
	// Registration went on regardless. One more event gives the subscriber,
	// now with room after reading, its notice of loss.
	first := <-slow.Events()
	second := <-slow.Events()
	if first.Type != pluginmanager.EventDiscovered || second.Seq != first.Seq+1 {
		t.Fatalf("first events = %+v, %+v", first, second)
	}
	testenv.StartPlugin(t, plugin.Config{Dir: h.dir, Type: "CSIPlugin", Name: "d"})
	// How many it missed depends on how many of a, b and c's events were
	// published before it read (a change's event may follow WaitSocket; see
	// plugintest): at least c's Discovered, and usually 4. The count is
	// exact: the Lost event's Seq is that of the last one missed.
	ev := <-slow.Events()
	if ev.Type != pluginmanager.EventLost || ev.Missed < 1 || ev.Seq != second.Seq+uint64(ev.Missed) {
		t.Errorf("after falling behind got %+v (the last event read was %d), want a Lost event counting exactly those missed", ev, second.Seq)
	}
	if next := <-slow.Events(); next.Seq != ev.Seq+1 {
		t.Errorf("event after Lost has seq %d, want %d", next.Seq, ev.Seq+1)
	}
}

func TestSubscriptionClosedWhenRunReturns(t *testing.T) {
	m, err := pluginmanager.New(pluginmanager.Options{Dir: testenv.ShortDir(t, "pm")})
	if err != nil {
		t.Fatal(err)
	}
	sub := m.Subscribe()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := m.Run(ctx); err != nil {
		t.Fatal(err)
	}
	if _, open := <-sub.Events(); open {
		t.Error("subscription still open after Run returned")
	}
	if _, open := <-m.Subscribe().Events(); open {
		t.Error("subscription made after Run returned is open")
	}
	sub.Close() // closing again is harmless
}

func TestRestartDoesNotDeregisterUnlessAsked(t *testing.T) {
	for _, deregister := range []bool{false, true} {
		rec := plugintest.NewRecorder()
		dir := testenv.ShortDir(t, "pm")
		p := testenv.StartPlugin(t, plugin.Config{Dir: dir, Type: "CSIPlugin", Name: "x"})
		m, err := pluginmanager.New(pluginmanager.Options{Dir: dir, DeregisterOnShutdown: deregister})
		if err != nil {
			t.Fatal(err)
		}
		m.AddHandler("CSIPlugin", rec)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error)
		go func() { done <- m.Run(ctx) }()
		if err := p.WaitRegistered(ctx); err != nil {
			t.Fatal(err)
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if got := rec.Count("deregister", "x"); got != map[bool]int{false: 0, true: 1}[deregister] {
			t.Errorf("DeregisterOnShutdown=%v: %d deregistrations", deregister, got)
		}
	}
}

// TestRunLeavesNoTransportGoroutine: when Run returns, nothing of the
// connections it held to plugins runs any more, at once rather than a
// moment later: the watches, their Poller's epoll set and its goroutine,
// the acknowledgement timers, all stopped and waited for.
func TestRunLeavesNoTransportGoroutine(t *testing.T) {
	const n = 5
	dir := testenv.ShortDir(t, "pm")
	for i := range n {
		testenv.StartPlugin(t, plugin.Config{Dir: dir, Type: "CSIPlugin", Name: fmt.Sprint("p", i)})
	}
	reg := prometheus.NewPedanticRegistry()
	m, err := pluginmanager.New(pluginmanager.Options{Dir: dir, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	m.AddHandler("CSIPlugin", plugintest.NewRecorder())
	sub := m.Subscribe()
	defer sub.Close()
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	// A registration holds its connection before it is published.
	for registered := 0; registered < n; {
		select {
		case ev := <-sub.Events():
			if ev.Type == pluginmanager.EventRegistered {
				registered++
			}
		case <-ctx.Done():
			t.Fatalf("%d of %d plugins registered", registered, n)
		}
	}
	held := func() float64 {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "plugd_held_connections" {
				return mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		return 0
	}
	if got := held(); got != n {
		t.Fatalf("%v connections held, want %d", got, n)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1<<20)
	stacks := string(buf[:runtime.Stack(buf, true)])
	for g := range strings.SplitSeq(stacks, "\n\n") {
		if strings.Contains(g, "plugd/internal/unaryconn.") || strings.Contains(g, "pluginmanager/internal/connset.") {
			t.Errorf("a goroutine of the transport still runs after Run returned:\n%s", g)
		}
	}
}

func TestSubscribeWithReplay(t *testing.T) {
	h := start(t, pluginmanager.Options{EventHistory: 3}, map[string]pluginmanager.Handler{"CSIPlugin": plugintest.NewRecorder()})
	<-h.m.Synced()
	var last pluginmanager.Event
	for _, name := range []string{"a", "b"} {
		p := testenv.StartPlugin(t, plugin.Config{Dir: h.dir, Type: "CSIPlugin", Name: name})
		h.WaitSocket(p.Path(), pluginmanager.StateRegistered)
	}
	all := h.m.SubscribeWithReplay(100)
	defer all.Close()
	// Only the last three of the four events were kept.
	for i, want := range []pluginmanager.EventType{pluginmanager.EventRegistered, pluginmanager.EventDiscovered, pluginmanager.EventRegistered} {
		ev := <-all.Events()
		if ev.Type != want || (i > 0 && ev.Seq != last.Seq+1) {
			t.Fatalf("replayed event %d = %+v, want %s following seq %d", i, ev, want, last.Seq)
		}
		last = ev
	}
	if last.Plugin.Name != "b" || last.Seq != 4 {
		t.Errorf("last replayed = %+v", last)
	}
	// Live events follow without a gap.
	testenv.StartPlugin(t, plugin.Config{Dir: h.dir, Type: "CSIPlugin", Name: "c"})
	if ev := <-all.Events(); ev.Seq != last.Seq+1 || ev.Type != pluginmanager.EventDiscovered {
		t.Errorf("first live event = %+v, want seq %d", ev, last.Seq+1)
	}
}
