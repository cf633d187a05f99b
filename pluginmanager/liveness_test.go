package pluginmanager_test

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/plugd/plugd/internal/testenv"
	"github.com/plugd/plugd/plugin"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/plugd/plugd/pluginmanager"
	"github.com/plugd/plugd/plugintest"
)

// moody is a plugin whose answers the test changes while it runs.
type moody struct {
	registerapi.UnimplementedRegistrationServer
	mu   sync.Mutex
	info *registerapi.PluginInfo
	down bool // GetInfo fails, as a wedged plugin's would
}

func (p *moody) set(f func(*moody)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	f(p)
}

func (p *moody) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.down {
		return nil, status.Error(codes.Unavailable, "wedged")
	}
	return p.info, nil
}

func (p *moody) NotifyRegistrationStatus(context.Context, *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	return &registerapi.RegistrationStatusResponse{}, nil
}

// probeEvery is how often plugins are probed in these tests: on a fake
// clock, they are probed when the test moves it.
const probeEvery = 10 * time.Second

func TestUnhealthyThenHealthyWithoutFlapping(t *testing.T) {
	rec := plugintest.NewRecorder()
	clk := fakeClock()
	h := start(t, pluginmanager.Options{ProbeInterval: probeEvery, UnhealthyGrace: time.Hour, Clock: clk},
		map[string]pluginmanager.Handler{"CSIPlugin": rec})
	path := filepath.Join(h.dir, "moody.sock")
	p := &moody{info: &registerapi.PluginInfo{Type: "CSIPlugin", Name: "moody", SupportedVersions: []string{"1.0.0"}}}
	serveRaw(t, path, func(s *grpc.Server) { registerapi.RegisterRegistrationServer(s, p) })
	h.WaitSocket(path, pluginmanager.StateRegistered)

	p.set(func(p *moody) { p.down = true })
	clk.Step(plugintest.MaxProbeDelay(probeEvery))
	ev := h.WaitEvent(path, pluginmanager.EventUnhealthy)
	if ev.Reason != pluginmanager.ReasonUnhealthy || ev.State != pluginmanager.StateUnhealthy {
		t.Errorf("unhealthy event = %+v", ev)
	}
	if s := h.WaitSocket(path, pluginmanager.StateUnhealthy); s.UnhealthySince.IsZero() || s.RegisteredSince.IsZero() {
		t.Errorf("unhealthy status = %+v, want still registered, with the time it stopped answering", s)
	}

	p.set(func(p *moody) { p.down = false })
	clk.Step(probeEvery) // an Unhealthy plugin is asked again each interval, unjittered
	h.WaitEvent(path, pluginmanager.EventHealthy)
	if s := h.WaitSocket(path, pluginmanager.StateRegistered); !s.UnhealthySince.IsZero() || s.LastError != "" {
		t.Errorf("recovered status = %+v", s)
	}
	if got := calls(rec); len(got) != 2 {
		t.Errorf("handler calls = %q, want only the first validate and register: no flapping", got)
	}
}

func TestDeadPluginDeregisteredAfterGraceThenBack(t *testing.T) {
	const grace = 30 * time.Second
	rec := plugintest.NewRecorder()
	clk := fakeClock()
	h := start(t, pluginmanager.Options{ProbeInterval: probeEvery, Clock: clk}, nil)
	h.m.AddHandler("CSIPlugin", rec, pluginmanager.HandlerOptions{UnhealthyGrace: grace})
	path := filepath.Join(h.dir, "crash.sock")
	info := &registerapi.PluginInfo{Type: "CSIPlugin", Name: "crash", SupportedVersions: []string{"1.0.0"}}

	// A plugin process killed with SIGKILL leaves its socket file behind,
	// with nobody listening: a listener closed without unlinking is that.
	l := testenv.ListenUnix(t, path)
	l.SetUnlinkOnClose(false)
	srv := grpc.NewServer()
	registerapi.RegisterRegistrationServer(srv, &moody{info: info})
	served := make(chan struct{})
	go func() { defer close(served); srv.Serve(l) }()
	h.WaitSocket(path, pluginmanager.StateRegistered)

	// Its connection hangs up: probed at once, without the clock moving.
	srv.Stop()
	<-served
	unhealthy := h.WaitEvent(path, pluginmanager.EventUnhealthy)
	// Asked again every interval, it is let go at the end of its grace
	// period, not a nanosecond before.
	clk.Step(grace - time.Nanosecond)
	clk.Step(time.Nanosecond)
	dereg := h.WaitEvent(path, pluginmanager.EventDeregistered)
	if held := dereg.Time.Sub(unhealthy.Time); held != grace {
		t.Errorf("deregistered %s after it stopped answering, want at the end of its %s grace period", held, grace)
	}
	s := h.WaitSocket(path, pluginmanager.StateFailed)
	if s.Reason != pluginmanager.ReasonUnhealthy || s.NextRetry.IsZero() {
		t.Errorf("after the grace period: %+v", s)
	}
	if rec.Count("deregister", "crash") != 1 {
		t.Errorf("calls = %q", calls(rec))
	}
	if s.NextRetry.Before(dereg.Time) || s.NextRetry.After(dereg.Time.Add(time.Second)) {
		t.Errorf("tried again at %s, want within a backoff after it was let go (%s)", s.NextRetry, dereg.Time)
	}

	// The plugin restarts: a new socket, registered at once.
	serveRaw(t, path+".new", func(s *grpc.Server) { registerapi.RegisterRegistrationServer(s, &moody{info: info}) })
	if err := renameOver(path+".new", path); err != nil {
		t.Fatal(err)
	}
	h.WaitSocket(path, pluginmanager.StateRegistered)
	rec.WaitCalls(t, "register", "crash", 2)
}

func TestProbeFindingAnotherPluginRegistersItAfresh(t *testing.T) {
	rec := plugintest.NewRecorder()
	clk := fakeClock()
	h := start(t, pluginmanager.Options{ProbeInterval: probeEvery, Clock: clk}, map[string]pluginmanager.Handler{"CSIPlugin": rec})
	path := filepath.Join(h.dir, "shifty.sock")
	p := &moody{info: &registerapi.PluginInfo{Type: "CSIPlugin", Name: "first", SupportedVersions: []string{"1.0.0"}}}
	serveRaw(t, path, func(s *grpc.Server) { registerapi.RegisterRegistrationServer(s, p) })
	h.WaitSocket(path, pluginmanager.StateRegistered)

	p.set(func(p *moody) {
		p.info = &registerapi.PluginInfo{Type: "CSIPlugin", Name: "second", SupportedVersions: []string{"1.0.0"}}
	})
	clk.Step(plugintest.MaxProbeDelay(probeEvery))
	rec.WaitCalls(t, "register", "second", 1)
	if got := calls(rec); len(got) != 5 || got[2] != "deregister first" {
		t.Errorf("calls = %q, want the first taken back before the second registers", got)
	}
	if s := h.WaitSocket(path, pluginmanager.StateRegistered); s.Name != "second" {
		t.Errorf("status = %+v", s)
	}
}

func TestStaleSocketIsReportedAndOptionallyRemoved(t *testing.T) {
	h := start(t, pluginmanager.Options{RemoveStaleAfter: time.Nanosecond}, map[string]pluginmanager.Handler{"CSIPlugin": plugintest.NewRecorder()})
	path := filepath.Join(h.dir, "left.sock")
	testenv.DeadSocket(t, path)
	// Stale, then removed by the manager (it is older than a nanosecond),
	// and so forgotten.
	if ev := h.WaitEvent(path, pluginmanager.EventFailed); ev.State != pluginmanager.StateStale {
		t.Errorf("a socket nobody listens on is %s, want Stale", ev.State)
	}
	h.WaitEvent(path, pluginmanager.EventRemoved)
	if _, ok := statPath(path); ok {
		t.Error("the stale socket is still there")
	}
}

// connCounter counts the connections a plugin's gRPC server accepts.
type connCounter struct{ conns chan struct{} }

func (c connCounter) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }
func (c connCounter) HandleRPC(context.Context, stats.RPCStats)                       {}
func (c connCounter) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return ctx
}
func (c connCounter) HandleConn(_ context.Context, s stats.ConnStats) {
	if _, ok := s.(*stats.ConnBegin); ok {
		c.conns <- struct{}{}
	}
}

// counting is moody, also telling of each GetInfo it answers.
type counting struct {
	*moody
	calls chan struct{}
}

func (p counting) GetInfo(ctx context.Context, r *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	p.calls <- struct{}{}
	return p.moody.GetInfo(ctx, r)
}

// Probes go over the connection the plugin registered over: the plugin sees
// one connection, however many times it is asked.
func TestProbesUseTheConnectionRegisteredOver(t *testing.T) {
	clk := fakeClock()
	h := start(t, pluginmanager.Options{ProbeInterval: probeEvery, Clock: clk},
		map[string]pluginmanager.Handler{"CSIPlugin": plugintest.NewRecorder()})
	path := filepath.Join(h.dir, "held.sock")
	p := counting{
		moody: &moody{info: &registerapi.PluginInfo{Type: "CSIPlugin", Name: "held", SupportedVersions: []string{"1.0.0"}}},
		calls: make(chan struct{}, 100),
	}
	cc := connCounter{conns: make(chan struct{}, 100)}
	serveRaw(t, path, func(s *grpc.Server) { registerapi.RegisterRegistrationServer(s, p) }, grpc.StatsHandler(cc))
	h.WaitSocket(path, pluginmanager.StateRegistered)

	deadline := time.After(testenv.Timeout)
	for i := 0; i < 10; i++ { // the registration's GetInfo, then probes
		if i > 0 {
			clk.Step(plugintest.MaxProbeDelay(probeEvery))
		}
		select {
		case <-p.calls:
		case <-deadline:
			t.Fatalf("%d GetInfo calls, want 10", i)
		}
	}
	if n := len(cc.conns); n != 1 {
		t.Errorf("the plugin accepted %d connections for 10 GetInfo calls, want 1", n)
	}
}

// A plugin whose server closes connections (here, at their maximum age) is
// connected to again the moment it does, with no call: it stays Registered,
// without a word to its handler, and is asked nothing (a plugin that logs
// every GetInfo logs nothing for it).
func TestConnectionClosedByPluginIsNotUnhealthy(t *testing.T) {
	rec := plugintest.NewRecorder()
	h := start(t, pluginmanager.Options{},
		map[string]pluginmanager.Handler{"CSIPlugin": rec})
	path := filepath.Join(h.dir, "aging.sock")
	p := counting{
		moody: &moody{info: &registerapi.PluginInfo{Type: "CSIPlugin", Name: "aging", SupportedVersions: []string{"1.0.0"}}},
		calls: make(chan struct{}, 100),
	}
	cc := connCounter{conns: make(chan struct{}, 100)}
	serveRaw(t, path, func(s *grpc.Server) { registerapi.RegisterRegistrationServer(s, p) },
		grpc.StatsHandler(cc),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionAge: 30 * time.Millisecond, MaxConnectionAgeGrace: 10 * time.Millisecond}))
	h.WaitSocket(path, pluginmanager.StateRegistered)

	deadline := time.After(testenv.Timeout)
	// grpc-go closes a connection a second after telling the client it will
	// (GOAWAY), unless the client closes it first.
	for i := 0; i < 3; i++ {
		select {
		case <-cc.conns:
		case <-deadline:
			t.Fatalf("the plugin accepted %d connections, want 3: closed connections are not replaced", i)
		}
	}
	for len(h.sub.Events()) > 0 {
		if ev := <-h.sub.Events(); ev.Plugin.Socket == path && ev.Type != pluginmanager.EventDiscovered && ev.Type != pluginmanager.EventRegistered {
			t.Errorf("event %s (%s), want none after registration", ev.Type, ev.Error)
		}
	}
	h.WaitSocket(path, pluginmanager.StateRegistered)
	if got := calls(rec); len(got) != 2 {
		t.Errorf("handler calls = %q, want only the first validate and register", got)
	}
	if n := len(p.calls); n != 1 {
		t.Errorf("the plugin was asked GetInfo %d times, want once: a connection is replaced without a call", n)
	}
}

// A registered plugin's gRPC server stopping gracefully is not held up by
// the connection the manager keeps: GracefulStop waits for every connection
// to close, and grpc-go, having sent GOAWAY and a PING to an idle one, waits
// seconds for an answer before it closes it by itself.
func TestGracefulStopOfARegisteredPluginIsNotHeldUp(t *testing.T) {
	h := start(t, pluginmanager.Options{ProbeInterval: time.Hour},
		map[string]pluginmanager.Handler{"CSIPlugin": plugintest.NewRecorder()})
	path := filepath.Join(h.dir, "graceful.sock")
	p := &moody{info: &registerapi.PluginInfo{Type: "CSIPlugin", Name: "graceful", SupportedVersions: []string{"1.0.0"}}}
	srv := serveRaw(t, path, func(s *grpc.Server) { registerapi.RegisterRegistrationServer(s, p) })
	h.WaitSocket(path, pluginmanager.StateRegistered)

	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		srv.GracefulStop()
	}()
	select {
	case <-stopped:
	case <-time.After(2 * time.Second): // grpc-go alone takes 6 s
		t.Fatal("GracefulStop of a registered plugin's server took over 2s: the manager's connection held it up")
	}
}

// At the defaults, a plugin that logs every GetInfo, as node-driver-registrar
// does, is asked once at registration and then at most once in five minutes:
// the held connection, not the probe, says it is alive.
func TestDefaultsProbeAtMostOncePerFiveMinutes(t *testing.T) {
	clk := fakeClock()
	h := start(t, pluginmanager.Options{Clock: clk}, map[string]pluginmanager.Handler{"CSIPlugin": plugintest.NewRecorder()})
	path := filepath.Join(h.dir, "csi.example.com-reg.sock")
	p := counting{
		moody: &moody{info: &registerapi.PluginInfo{Type: "CSIPlugin", Name: "csi.example.com",
			Endpoint: "/var/lib/kubelet/plugins/csi.example.com/csi.sock", SupportedVersions: []string{"1.0.0"}}},
		calls: make(chan struct{}, 1000),
	}
	serveRaw(t, path, func(s *grpc.Server) { registerapi.RegisterRegistrationServer(s, p) })
	h.WaitSocket(path, pluginmanager.StateRegistered)
	<-p.calls // the registration's

	for range 30 {
		clk.Step(10 * time.Second)
	}
	// A probe due by now is under way or done once the next one is: move on
	// to the latest time the first can be due, and wait for it.
	clk.Step(plugintest.MaxProbeDelay(pluginmanager.DefaultProbeInterval) - 5*time.Minute)
	select {
	case <-p.calls:
	case <-time.After(testenv.Timeout):
		t.Fatal("no probe at all")
	}
	h.WaitSocket(path, pluginmanager.StateRegistered)
	if n := len(p.calls); n != 0 {
		t.Errorf("%d more GetInfo calls within %s of registration, want one", n, plugintest.MaxProbeDelay(pluginmanager.DefaultProbeInterval))
	}
}

// A Deregistered event carries the state that is true once the plugin is
// let go (issue 25, item 10): Failed, with its reason and retry, at the end
// of its grace period; none when its socket file is gone. Its Error is the
// handler's failure only.
func TestDeregisteredCarriesTheStateThatIsTrue(t *testing.T) {
	const grace = 30 * time.Second
	clk := fakeClock()
	h := start(t, pluginmanager.Options{ProbeInterval: probeEvery, Clock: clk}, nil)
	h.m.AddHandler("CSIPlugin", plugintest.NewRecorder(), pluginmanager.HandlerOptions{UnhealthyGrace: grace})

	killed := filepath.Join(h.dir, "killed.sock")
	kill := serveLeaving(t, killed, &moody{info: &registerapi.PluginInfo{Type: "CSIPlugin", Name: "killed", SupportedVersions: []string{"1.0.0"}}})
	h.WaitSocket(killed, pluginmanager.StateRegistered)
	kill()
	h.WaitEvent(killed, pluginmanager.EventUnhealthy)
	clk.Step(grace)
	ev := h.WaitEvent(killed, pluginmanager.EventDeregistered)
	if ev.State != pluginmanager.StateFailed || ev.Reason != pluginmanager.ReasonUnhealthy || ev.NextRetry.IsZero() || ev.Error != "" {
		t.Errorf("deregistered at the end of its grace: %s %s, retry %s, error %q; want Failed, unhealthy, a retry, no error", ev.State, ev.Reason, ev.NextRetry, ev.Error)
	}

	p := testenv.StartPlugin(t, plugin.Config{Dir: h.dir, Type: "CSIPlugin", Name: "removed", Versions: []string{"1.0.0"}})
	h.WaitSocket(p.Path(), pluginmanager.StateRegistered)
	p.Close()
	if ev := h.WaitEvent(p.Path(), pluginmanager.EventDeregistered); ev.State != "" || ev.Error != "" {
		t.Errorf("deregistered as its socket went: %q, error %q; want no state", ev.State, ev.Error)
	}
	h.WaitEvent(p.Path(), pluginmanager.EventRemoved)
}
