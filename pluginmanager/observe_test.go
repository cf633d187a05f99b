package pluginmanager_test

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/plugd/plugd/internal/testenv"
	"github.com/plugd/plugd/plugin"
	"github.com/plugd/plugd/pluginmanager"
	"github.com/plugd/plugd/plugintest"
)

// registrar serves a registration socket as node-driver-registrar does for a
// CSI driver: type CSIPlugin, versions ["1.0.0"], the endpoint the driver's own
// socket, and it counts what it is told.
type registrar struct {
	registerapi.UnimplementedRegistrationServer
	endpoint string
	told     atomic.Int32
	last     atomic.Value // *registerapi.RegistrationStatus
}

func (r *registrar) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	return &registerapi.PluginInfo{Type: "CSIPlugin", Name: "csi.example.com", Endpoint: r.endpoint, SupportedVersions: []string{"1.0.0"}}, nil
}

func (r *registrar) NotifyRegistrationStatus(_ context.Context, s *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	r.told.Add(1)
	r.last.Store(s)
	return &registerapi.RegistrationStatusResponse{}, nil
}

// An observer beside the manager that registers: it sees every plugin and
// whether it answers, and no plugin hears from it.
func TestObserverBesideARegisteringManager(t *testing.T) {
	rec := plugintest.NewRecorder()
	owner := start(t, pluginmanager.Options{}, map[string]pluginmanager.Handler{"CSIPlugin": rec, "example.com/Greeter": rec})
	clk := fakeClock()
	obs := start(t, pluginmanager.Options{Dir: owner.dir, Observe: true, ProbeInterval: lookEvery, Clock: clk}, nil)

	reg := &registrar{endpoint: filepath.Join(testenv.ShortDir(t, "csi"), "csi.sock")}
	regPath := filepath.Join(owner.dir, "csi.example.com-reg.sock")
	l := testenv.ListenUnix(t, regPath)
	l.SetUnlinkOnClose(false) // killed below: its socket stays, as a crashed registrar's would
	srv := grpc.NewServer()
	registerapi.RegisterRegistrationServer(srv, reg)
	served := make(chan struct{})
	go func() { defer close(served); srv.Serve(l) }()
	t.Cleanup(func() { srv.Stop(); <-served; os.Remove(regPath) })
	greeter := testenv.StartPlugin(t, plugin.Config{Dir: owner.dir, Type: "example.com/Greeter", Name: "greeter", Versions: []string{"v1"}})

	owner.WaitSocket(regPath, pluginmanager.StateRegistered)
	owner.WaitSocket(greeter.Path(), pluginmanager.StateRegistered)
	seen := obs.WaitSocket(regPath, pluginmanager.StateAnswering)
	if seen.Type != "CSIPlugin" || seen.Name != "csi.example.com" || seen.Endpoint != reg.endpoint {
		t.Errorf("the observer saw %+v", seen.Plugin)
	}
	obs.WaitSocket(greeter.Path(), pluginmanager.StateAnswering)

	// Several looks later, each plugin was still told once, by its manager.
	for look := 2; look <= 3; look++ {
		for _, s := range obs.lookAgain(clk, regPath, greeter.Path()) {
			if s.State != pluginmanager.StateAnswering || s.Attempts != look {
				t.Errorf("look %d at %s: %s, attempt %d; want still Answering", look, filepath.Base(s.Socket), s.State, s.Attempts)
			}
		}
	}
	if n := reg.told.Load(); n != 1 {
		t.Errorf("the registrar was told %d times, want once", n)
	}
	if st := reg.last.Load().(*registerapi.RegistrationStatus); !st.PluginRegistered {
		t.Errorf("the registrar was told %+v", st)
	}
	if n := greeter.Notifications(); n != 1 {
		t.Errorf("the SDK plugin was told %d times, want once", n)
	}
	if n := len(calls(rec)); n != 4 {
		t.Errorf("the owner's handler calls = %q; the observer must call none", calls(rec))
	}

	// Killed: not answering at the next look.
	srv.Stop()
	<-served
	if s := obs.lookAgain(clk, regPath)[0]; s.State != pluginmanager.StateStale {
		t.Errorf("at the next look after the kill it is %s, want Stale (a socket nobody listens on)", s.State)
	}

	// Removed: gone from the observer too.
	greeter.Close()
	obs.WaitGone(greeter.Path())
}

// lookEvery is how often an observer in these tests looks at each plugin:
// on a fake clock, it looks again when the test says (lookAgain).
const lookEvery = time.Minute

// lookAgain makes the observer look at each of paths once more (a socket
// that does not answer, retried with backoff, maybe more than once), and
// returns their statuses after that look, in the order of paths.
func (h *harness) lookAgain(clk *testingclock.FakeClock, paths ...string) []pluginmanager.PluginStatus {
	h.t.Helper()
	before := h.m.Plugins()
	clk.Step(plugintest.MaxProbeDelay(lookEvery))
	var out []pluginmanager.PluginStatus
	h.Until("one more look at each", func(ps []pluginmanager.PluginStatus) bool {
		out = out[:0]
		for _, path := range paths {
			was, _ := plugintest.Find(before, path)
			now, ok := plugintest.Find(ps, path)
			if !ok || now.Attempts <= was.Attempts {
				return false
			}
			out = append(out, now)
		}
		return true
	})
	return out
}

// looker is an Observer: it counts looks and can say the endpoint is down.
type looker struct {
	looks, forgets atomic.Int32
	down           atomic.Bool
}

func (l *looker) Observe(context.Context, pluginmanager.Plugin) error {
	l.looks.Add(1)
	if l.down.Load() {
		return errors.New("the driver's Probe says not ready")
	}
	return nil
}

func (l *looker) Forget(pluginmanager.Plugin) { l.forgets.Add(1) }

// In observe mode the observer of a type is asked to look, after every
// answered GetInfo, and the type's handler is never asked to validate or
// register.
func TestObserverLooks(t *testing.T) {
	calls := atomic.Int32{}
	handler := pluginmanager.HandlerFuncs{
		ValidateFunc: func(context.Context, pluginmanager.Plugin) error { calls.Add(1); return nil },
		RegisterFunc: func(context.Context, pluginmanager.Plugin) error { calls.Add(1); return nil },
	}
	l := &looker{}
	dir := testenv.ShortDir(t, "ob")
	clk := fakeClock()
	obs := start(t, pluginmanager.Options{Dir: dir, Observe: true, ProbeInterval: lookEvery, Clock: clk}, map[string]pluginmanager.Handler{"CSIPlugin": handler})
	obs.m.AddObserver("CSIPlugin", l)
	p := testenv.StartPlugin(t, plugin.Config{Dir: dir, Type: "CSIPlugin", Name: "csi"})
	// The first look's event, not the state: WaitSocket could return before
	// that event comes, and the WaitLook below would take it for the next.
	if ev := obs.WaitLook(p.Path()); ev.Type != pluginmanager.EventAnswering {
		t.Fatalf("first look = %+v, want Answering", ev)
	}

	l.down.Store(true)
	clk.Step(plugintest.MaxProbeDelay(lookEvery))
	ev := obs.WaitLook(p.Path())
	if ev.Type != pluginmanager.EventNotAnswering || ev.Reason != pluginmanager.ReasonEndpoint || !strings.Contains(ev.Error, "not ready") {
		t.Errorf("event = %+v, want NotAnswering for the endpoint", ev)
	}
	l.down.Store(false)
	clk.Step(plugintest.MaxProbeDelay(lookEvery))
	if ev := obs.WaitLook(p.Path()); ev.Type != pluginmanager.EventAnswering {
		t.Errorf("event = %+v, want Answering", ev)
	}

	p.Close()
	obs.WaitGone(p.Path())
	if calls.Load() != 0 || l.looks.Load() != 3 || l.forgets.Load() != 1 {
		t.Errorf("validate/register calls %d, looks %d, forgets %d; want 0, 3, 1", calls.Load(), l.looks.Load(), l.forgets.Load())
	}
	if n := p.Notifications(); n != 0 {
		t.Errorf("the observed plugin was told %d times", n)
	}
}

// forgetful is an Observer whose Forget says it was called, then panics or
// hangs (until release is closed), as mode says.
type forgetful struct {
	mode    atomic.Value // "panic" or "hang"
	called  chan string  // the mode of each Forget
	release chan struct{}
}

func (f *forgetful) Observe(context.Context, pluginmanager.Plugin) error { return nil }

func (f *forgetful) Forget(pluginmanager.Plugin) {
	mode, _ := f.mode.Load().(string)
	f.called <- mode
	switch mode {
	case "panic":
		panic("forgetful")
	case "hang":
		<-f.release
	}
}

// An observer's Forget is called in the sandbox, as handler methods are:
// one that panics does not bring the manager down, one that hangs does not
// hold up its work past HandlerTimeout, and the socket is forgotten either
// way.
func TestObserverForgetSandboxed(t *testing.T) {
	f := &forgetful{called: make(chan string, 3), release: make(chan struct{})}
	t.Cleanup(func() { close(f.release) }) // after the manager stops
	dir := testenv.ShortDir(t, "ob")
	log, warnings := testenv.WarnLogger()
	obs := start(t, pluginmanager.Options{Dir: dir, Observe: true, HandlerTimeout: 200 * time.Millisecond, Logger: log}, nil)
	obs.m.AddObserver("CSIPlugin", f)
	for _, mode := range []string{"panic", "hang"} {
		f.mode.Store(mode)
		p := testenv.StartPlugin(t, plugin.Config{Dir: dir, Type: "CSIPlugin", Name: "csi-" + mode})
		obs.WaitSocket(p.Path(), pluginmanager.StateAnswering)
		p.Close()
		obs.WaitGone(p.Path())
		select {
		case got := <-f.called:
			if got != mode {
				t.Fatalf("Forget called in mode %q, want %q", got, mode)
			}
		case <-time.After(testenv.Timeout):
			t.Fatalf("the socket was forgotten, but Forget (%s) was not called", mode)
		}
	}
	// Both were said, the hang once it outlived HandlerTimeout.
	warnings.Wait(t, "name=csi-hang", testenv.Timeout)
	for _, mode := range []string{"panic", "hang"} {
		if !slices.ContainsFunc(strings.Split(warnings.String(), "\n"), func(l string) bool {
			return strings.Contains(l, "Forget failed") && strings.Contains(l, "name=csi-"+mode)
		}) {
			t.Errorf("no warning that Forget failed (%s); log: %s", mode, warnings)
		}
	}
	f.mode.Store("")
	p := testenv.StartPlugin(t, plugin.Config{Dir: dir, Type: "CSIPlugin", Name: "csi-after"})
	obs.WaitSocket(p.Path(), pluginmanager.StateAnswering)
}

// dialer is an Observer that looks at a plugin's endpoint as a CSI driver's
// observer does: it connects to it.
type dialer struct{}

func (dialer) Observe(ctx context.Context, p pluginmanager.Plugin) error {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", p.Endpoint)
	if err != nil {
		return err
	}
	return c.Close()
}

func (dialer) Forget(pluginmanager.Plugin) {}

// In observe mode a plugin whose endpoint went (a CSI driver restarted
// beside its live node-driver-registrar) is seen again within 2 s of its
// endpoint's return, however far its retries have backed off, as a managing
// manager registers it again (issue 25, item 10): the endpoint is connected
// to (no call) every 2 s at most meanwhile, and the plugin looked at as
// soon as it takes the connection.
func TestObservedEndpointBackWithinTwoSeconds(t *testing.T) {
	dir := testenv.ShortDir(t, "ob")
	ep := filepath.Join(testenv.ShortDir(t, "ep"), "csi.sock")
	serve := func() net.Listener {
		t.Helper()
		l, err := net.Listen("unix", ep)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	driver := serve()
	clk := fakeClock()
	obs := start(t, pluginmanager.Options{Dir: dir, Observe: true, ProbeInterval: lookEvery, Clock: clk,
		BackoffInitial: 10 * time.Second, BackoffMax: 2 * time.Minute}, nil)
	obs.m.AddObserver("CSIPlugin", dialer{})
	p := testenv.StartPlugin(t, plugin.Config{Dir: dir, Type: "CSIPlugin", Name: "csi", Endpoint: ep})
	if ev := obs.WaitLook(p.Path()); ev.Type != pluginmanager.EventAnswering {
		t.Fatalf("first look = %+v, want Answering", ev)
	}

	driver.Close() // the driver goes; its registrar stays
	clk.Step(plugintest.MaxProbeDelay(lookEvery))
	if ev := obs.WaitLook(p.Path()); ev.Type != pluginmanager.EventNotAnswering || ev.Reason != pluginmanager.ReasonEndpoint {
		t.Fatalf("look after the driver went = %+v, want NotAnswering for the endpoint", ev)
	}
	driver = serve() // back, while the next look's backoff is 10 s away
	defer driver.Close()
	clk.Step(2 * time.Second)
	if ev := obs.WaitLook(p.Path()); ev.Type != pluginmanager.EventAnswering {
		t.Errorf("look 2 s after the driver came back = %+v, want Answering", ev)
	}
	if n := p.Notifications(); n != 0 {
		t.Errorf("the observed plugin was told %d times", n)
	}
}

// An observed plugin whose endpoint takes connections but whose service
// fails (a CSI driver whose Probe says not ready) is looked at again with
// backoff, as any failure is: only an endpoint nobody listens on is waited
// for every 2 s, and the registration socket is not asked GetInfo that
// often.
func TestObservedServiceFailingBacksOff(t *testing.T) {
	const backoff = 10 * time.Second
	l := &looker{}
	l.down.Store(true)
	dir := testenv.ShortDir(t, "ob")
	clk := fakeClock()
	obs := start(t, pluginmanager.Options{Dir: dir, Observe: true, ProbeInterval: lookEvery, Clock: clk,
		BackoffInitial: backoff, BackoffMax: 2 * time.Minute}, nil)
	obs.m.AddObserver("CSIPlugin", l)
	p := testenv.StartPlugin(t, plugin.Config{Dir: dir, Type: "CSIPlugin", Name: "csi", Versions: []string{"1.0.0"}})
	ev := obs.WaitLook(p.Path())
	if ev.Type != pluginmanager.EventNotAnswering || ev.Reason != pluginmanager.ReasonEndpoint {
		t.Fatalf("first look = %+v, want NotAnswering for the endpoint", ev)
	}
	if wait := ev.NextRetry.Sub(ev.Time); wait < backoff*8/10 {
		t.Errorf("looked at again in %s, want its backoff (%s, jittered): its endpoint takes connections", wait, backoff)
	}
}
