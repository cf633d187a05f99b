package pluginmanager_test

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/plugd/plugd/internal/testenv"

	"google.golang.org/grpc"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/plugd/plugd/plugin"
	"github.com/plugd/plugd/pluginmanager"
)

// reporting is a handler (and observer) that says of each plugin's endpoint
// what the test tells it, through the function EndpointReporter gave it.
type reporting struct {
	mu      sync.Mutex
	reports map[string]func(error) // by socket
	got     chan string            // sockets as they register or are looked at
}

func newReporting() *reporting {
	return &reporting{reports: map[string]func(error){}, got: make(chan string, 100)}
}

func (h *reporting) take(ctx context.Context, p pluginmanager.Plugin) {
	report := pluginmanager.EndpointReporter(ctx)
	report(nil) // watched, and serving
	h.mu.Lock()
	h.reports[p.Socket] = report
	h.mu.Unlock()
	h.got <- p.Socket
}

func (h *reporting) Validate(context.Context, pluginmanager.Plugin) error { return nil }
func (h *reporting) Register(ctx context.Context, p pluginmanager.Plugin) error {
	h.take(ctx, p)
	return nil
}
func (h *reporting) Deregister(context.Context, pluginmanager.Plugin) {}
func (h *reporting) Observe(ctx context.Context, p pluginmanager.Plugin) error {
	h.take(ctx, p)
	return nil
}
func (h *reporting) Forget(pluginmanager.Plugin) {}

// report says the endpoint of the plugin at socket is down (err) or serves.
func (h *reporting) report(t *testing.T, socket string, err error) {
	t.Helper()
	h.mu.Lock()
	r := h.reports[socket]
	h.mu.Unlock()
	if r == nil {
		t.Fatalf("no reporter for %s", socket)
	}
	r(err)
}

func (h *reporting) wait(t *testing.T) string {
	t.Helper()
	select {
	case s := <-h.got:
		return s
	case <-time.After(testenv.Timeout):
		t.Fatal("the handler was not called")
		return ""
	}
}

var errDriverGone = errors.New("CSI endpoint /csi/csi.sock: connection refused")

// A handler's word that a registered plugin's endpoint is down makes it
// Unhealthy, reason endpoint, at once; its word that it serves again makes
// it Registered; down for its grace period, it is deregistered. Nothing
// waits for a probe.
func TestEndpointDownIsUnhealthy(t *testing.T) {
	const grace = time.Minute
	clk := fakeClock()
	rh := newReporting()
	h := start(t, pluginmanager.Options{Clock: clk}, nil)
	h.m.AddHandler("CSIPlugin", rh, pluginmanager.HandlerOptions{UnhealthyGrace: grace})
	p := testenv.StartPlugin(t, plugin.Config{Dir: h.dir, Type: "CSIPlugin", Name: "csi", Endpoint: "/csi/csi.sock", Versions: []string{"1.0.0"}})
	h.WaitSocket(p.Path(), pluginmanager.StateRegistered)
	rh.wait(t)

	rh.report(t, p.Path(), errDriverGone)
	ev := h.WaitEvent(p.Path(), pluginmanager.EventUnhealthy)
	if ev.Reason != pluginmanager.ReasonEndpoint || !strings.Contains(ev.Error, "connection refused") {
		t.Errorf("event %+v, want Unhealthy with reason endpoint and the handler's error", ev)
	}
	rh.report(t, p.Path(), nil)
	h.WaitEvent(p.Path(), pluginmanager.EventHealthy)
	if s := h.WaitSocket(p.Path(), pluginmanager.StateRegistered); s.Reason != "" || s.LastError != "" {
		t.Errorf("back: %+v", s)
	}

	rh.report(t, p.Path(), errDriverGone)
	unhealthy := h.WaitEvent(p.Path(), pluginmanager.EventUnhealthy)
	clk.Step(grace)
	dereg := h.WaitEvent(p.Path(), pluginmanager.EventDeregistered)
	if d := dereg.Time.Sub(unhealthy.Time); d != grace {
		t.Errorf("deregistered %s after its endpoint went, want its grace period %s", d, grace)
	}
	if s := h.WaitSocket(p.Path(), pluginmanager.StateFailed); s.Reason != pluginmanager.ReasonEndpoint {
		t.Errorf("after the grace period: %+v", s)
	}
	// A report for the registration that was let go changes nothing.
	rh.report(t, p.Path(), nil)
}

// serveLeaving serves a registration server on path and returns a function
// that stops it as SIGKILL would: the socket file stays, nobody listening.
func serveLeaving(t *testing.T, path string, impl registerapi.RegistrationServer) (kill func()) {
	t.Helper()
	l := testenv.ListenUnix(t, path)
	l.SetUnlinkOnClose(false)
	srv := grpc.NewServer()
	registerapi.RegisterRegistrationServer(srv, impl)
	served := make(chan struct{})
	go func() { defer close(served); srv.Serve(l) }()
	kill = func() { srv.Stop(); <-served }
	t.Cleanup(kill)
	return kill
}

// A plugin whose registrar dies, leaving its socket, while its handler says
// its endpoint serves (node-driver-registrar killed, the CSI driver up)
// stays registered, as with the kubelet, noting why; unless its type asks
// for it to go with its registrar.
func TestRegistrarGoneEndpointServing(t *testing.T) {
	for _, tc := range []struct {
		name  string
		opts  pluginmanager.HandlerOptions
		stays bool
	}{
		{"kept", pluginmanager.HandlerOptions{UnhealthyGrace: time.Minute}, true},
		{"DeregisterWithRegistrar", pluginmanager.HandlerOptions{UnhealthyGrace: time.Minute, DeregisterWithRegistrar: true}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := fakeClock()
			rh := newReporting()
			h := start(t, pluginmanager.Options{Clock: clk}, nil)
			h.m.AddHandler("CSIPlugin", rh, tc.opts)
			path := filepath.Join(h.dir, "registrar.sock")
			kill := serveLeaving(t, path, &moody{info: &registerapi.PluginInfo{Type: "CSIPlugin", Name: "csi", Endpoint: "/csi/csi.sock", SupportedVersions: []string{"1.0.0"}}})
			h.WaitSocket(path, pluginmanager.StateRegistered)
			rh.wait(t)

			kill()
			if !tc.stays {
				ev := h.WaitEvent(path, pluginmanager.EventUnhealthy)
				if ev.Reason != pluginmanager.ReasonUnhealthy {
					t.Errorf("event %+v, want Unhealthy, reason unhealthy", ev)
				}
				clk.Step(time.Minute)
				h.WaitEvent(path, pluginmanager.EventDeregistered)
				return
			}
			if ev := h.WaitEvent(path, pluginmanager.EventUnhealthy); ev.State != pluginmanager.StateRegistered || ev.Reason != pluginmanager.ReasonUnhealthy {
				t.Errorf("event %+v, want Unhealthy saying it stays Registered", ev)
			}
			if st := h.WaitSocket(path, pluginmanager.StateRegistered); !strings.Contains(st.LastError, "endpoint serves") {
				t.Errorf("status %+v, want Registered, noting its registrar is gone", st)
			}
			clk.Step(2 * time.Minute) // past any grace period
			rh.report(t, path, errDriverGone)
			ev := h.WaitEvent(path, pluginmanager.EventUnhealthy, pluginmanager.EventDeregistered)
			if ev.Type != pluginmanager.EventUnhealthy || ev.Reason != pluginmanager.ReasonEndpoint {
				t.Errorf("event %+v, want Unhealthy for the endpoint, the first since the registrar went", ev)
			}
		})
	}
}

// An observing manager holds the connection it looked over too: the
// plugin's death is seen at once, with no call and no clock moving; and its
// observer's word that the endpoint is down or back is recorded as it comes.
func TestObserverHoldsTheConnection(t *testing.T) {
	clk := fakeClock()
	rh := newReporting()
	h := start(t, pluginmanager.Options{Observe: true, Clock: clk}, nil)
	h.m.AddObserver("CSIPlugin", rh)
	path := filepath.Join(h.dir, "observed.sock")
	p := counting{
		moody: &moody{info: &registerapi.PluginInfo{Type: "CSIPlugin", Name: "csi", Endpoint: "/csi/csi.sock", SupportedVersions: []string{"1.0.0"}}},
		calls: make(chan struct{}, 100),
	}
	kill := serveLeaving(t, path, p)
	// The look's event, not the state: WaitSocket could return before the
	// Answering event comes, which the next WaitLook would take.
	if ev := h.WaitLook(path); ev.Type != pluginmanager.EventAnswering {
		t.Fatalf("first look %+v, want Answering", ev)
	}
	rh.wait(t)

	rh.report(t, path, errDriverGone)
	if ev := h.WaitLook(path); ev.Type != pluginmanager.EventNotAnswering || ev.Reason != pluginmanager.ReasonEndpoint {
		t.Errorf("event %+v, want NotAnswering for the endpoint", ev)
	}
	rh.report(t, path, nil)
	if ev := h.WaitLook(path); ev.Type != pluginmanager.EventAnswering {
		t.Errorf("event %+v, want Answering: its endpoint is back", ev)
	}
	rh.wait(t)
	calls := len(p.calls)

	kill()
	if ev := h.WaitLook(path); ev.Type != pluginmanager.EventNotAnswering || ev.State != pluginmanager.StateStale {
		t.Errorf("event %+v, want NotAnswering, Stale: nobody listens", ev)
	}
	if n := len(p.calls); n != calls {
		t.Errorf("%d GetInfo calls after the plugin went, want none: a hang-up needs only a connection", n-calls)
	}
}

// awaitPoll is the longest a plugin waiting for its endpoint waits for the
// next look at it (pluginmanager's own awaitPoll).
const awaitPoll = 2 * time.Second

// Issue 25, item 1: a plugin whose handler's Register fails while the
// endpoint it announced takes no connections is not told registered=false
// (a registrar exits when told so): it is Failed, reason endpoint, waiting
// for the endpoint, and registered, and told, within awaitPoll of the
// endpoint taking connections (the manager's clock moving no further).
func TestRegisterWaitsForItsEndpoint(t *testing.T) {
	clk := fakeClock()
	h := start(t, pluginmanager.Options{Clock: clk}, nil)
	h.m.AddHandler("example.com/Endpointed", pluginmanager.HandlerFuncs{RegisterFunc: func(ctx context.Context, p pluginmanager.Plugin) error {
		var d net.Dialer
		c, err := d.DialContext(ctx, "unix", p.Endpoint)
		if err != nil {
			return err
		}
		return c.Close()
	}})
	endpoint := filepath.Join(testenv.ShortDir(t, "ep"), "ep.sock")
	onStatus, told := statuses()
	p := testenv.StartPlugin(t, plugin.Config{Dir: h.dir, Type: "example.com/Endpointed", Name: "ep", Endpoint: endpoint, OnStatus: onStatus})

	ev := h.WaitEvent(p.Path(), pluginmanager.EventFailed, pluginmanager.EventRegistered)
	if ev.Type != pluginmanager.EventFailed || ev.Reason != pluginmanager.ReasonEndpoint || !strings.Contains(ev.Error, "waiting for its endpoint "+endpoint) {
		t.Fatalf("event %+v, want Failed, reason endpoint, waiting for its endpoint", ev)
	}
	if d := ev.NextRetry.Sub(ev.Time); d <= 0 || d > awaitPoll {
		t.Errorf("its endpoint looked at again in %s, want within %s", d, awaitPoll)
	}
	if s := h.WaitSocket(p.Path(), pluginmanager.StateFailed); s.Reason != pluginmanager.ReasonEndpoint {
		t.Errorf("status %+v, want Failed for its endpoint", s)
	}
	select {
	case st := <-told:
		t.Fatalf("the plugin was told %+v while its endpoint was down", st)
	default:
	}

	testenv.CountAccepts(t, endpoint)
	clk.Step(awaitPoll)
	h.WaitSocket(p.Path(), pluginmanager.StateRegistered)
	if st := <-told; !st.Registered {
		t.Errorf("the plugin was told %+v, want registered", st)
	}
}
