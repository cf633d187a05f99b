package dra

import (
	"encoding/json"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/plugd/plugd/api"
	"github.com/plugd/plugd/internal/testenv"
	"github.com/plugd/plugd/plugin"
	"github.com/plugd/plugd/pluginmanager"
	"github.com/plugd/plugd/plugintest"
)

// startObserving is start with the manager in observe mode, on a fake
// clock: it looks again when the test says (looks).
func startObserving(t *testing.T) *env {
	t.Helper()
	e := &env{t: t, reg: prometheus.NewPedanticRegistry(), clk: testingclock.NewFakeClock(time.Now())}
	e.h = New(Options{Registerer: e.reg})
	e.run(pluginmanager.Options{Observe: true, ProbeInterval: lookEvery, Clock: e.clk})
	return e
}

// lookEvery is how often the observer looks at each plugin.
const lookEvery = time.Minute

// observedOf returns Details of p, as plugd's status API encodes it.
func (e *env) observedOf(p pluginmanager.Plugin) (ObservedStatus, bool) {
	e.t.Helper()
	d := e.h.Details(p)
	if d == nil {
		return ObservedStatus{}, false
	}
	b, err := json.Marshal(d)
	if err != nil {
		e.t.Fatal(err)
	}
	var out ObservedStatus
	if err := json.Unmarshal(b, &out); err != nil {
		e.t.Fatal(err)
	}
	return out, true
}

// looks makes the observer look at the socket at path n more times, and
// returns the event of the last look.
func (e *env) looks(path string, n int) pluginmanager.Event {
	e.t.Helper()
	var ev pluginmanager.Event
	for range n {
		e.clk.Step(plugintest.MaxProbeDelay(lookEvery))
		ev = e.pm.WaitLook(path)
	}
	return ev
}

// In observe mode the handler checks that a DRA driver's endpoint is
// reachable, keeps no connection, and the plugin is never told anything.
func TestObserve(t *testing.T) {
	e := startObserving(t)
	endpoint := filepath.Join(testenv.ShortDir(t, "drap"), "dra.sock")
	srv := testenv.ServeGRPC(t, endpoint, nil) // a DRA endpoint has only to be reachable
	before := time.Now()                       // the manager may look as soon as the socket is there
	reg, err := plugin.Start(plugin.Config{
		Dir: e.dir, Type: Type, Name: "seen.example.com", Endpoint: endpoint,
		Versions: []string{"v2.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAPlugin"},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Close() })

	ps := e.pm.WaitSocket(reg.Path(), pluginmanager.StateAnswering)
	d, ok := e.observedOf(ps.Plugin)
	if !ok || !d.Observed || d.Driver != "seen.example.com" || d.Endpoint != endpoint || d.Service != "v1beta1.DRAPlugin" ||
		!d.Reachable || d.ReachableAt.Before(before) || d.LastError != "" {
		t.Errorf("details = %+v (%v), want observed, reachable, service v1beta1.DRAPlugin", d, ok)
	}

	e.looks(reg.Path(), 3)
	if n := reg.Notifications(); n != 0 {
		t.Errorf("the plugin was notified %d times, want none", n)
	}
	if ds := e.h.Drivers(); len(ds) != 0 {
		t.Errorf("drivers = %+v, want none in observe mode", ds)
	}

	// The DRA service goes while the registration socket still answers.
	srv.Stop()
	if ev := e.looks(reg.Path(), 1); ev.Type != pluginmanager.EventNotAnswering {
		t.Errorf("the look after the service went: %s, want NotAnswering", ev.Type)
	}
	ps = e.pm.WaitSocket(reg.Path(), pluginmanager.StateNotAnswering)
	if ps.Reason != pluginmanager.ReasonEndpoint || !strings.Contains(ps.LastError, endpoint) {
		t.Errorf("status = %+v, want reason endpoint naming %s", ps, endpoint)
	}
	if d, _ := e.observedOf(ps.Plugin); !d.Observed || d.Reachable || d.LastError == "" {
		t.Errorf("details = %+v, want unreachable, with the reason", d)
	}
	if n := reg.Notifications(); n != 0 {
		t.Errorf("the plugin was notified %d times, want none", n)
	}

	// The socket goes: the handler forgets it.
	if err := reg.Close(); err != nil {
		t.Fatal(err)
	}
	e.pm.WaitGone(reg.Path())
	if d := e.h.Details(ps.Plugin); d != nil {
		t.Errorf("details after the socket went = %+v, want none", d)
	}
}

// A driver offering no supported DRA service is NotAnswering, and says why.
func TestObserveUnsupportedService(t *testing.T) {
	e := startObserving(t)
	reg, err := plugin.Start(plugin.Config{
		Dir: e.dir, Type: Type, Name: "new.example.com", Endpoint: "/run/dra.sock", Versions: []string{"v2.DRAPlugin"},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Close() })
	ps := e.pm.WaitSocket(reg.Path(), pluginmanager.StateNotAnswering)
	if ps.Reason != pluginmanager.ReasonEndpoint || !strings.Contains(ps.LastError, "offers none of the DRA services supported") {
		t.Errorf("status = %+v, want reason endpoint, no supported service", ps)
	}
	if n := reg.Notifications(); n != 0 {
		t.Errorf("the plugin was notified %d times, want none", n)
	}
}

// Observing, the handler follows a driver's health stream as the kubelet
// does (kubeletplugin serves each stream its own reports), and shows the
// devices' health in Details; the stream ends when the socket goes.
func TestObserveHealth(t *testing.T) {
	e := startObserving(t)
	const name = "gpu.example.com"
	helper := e.startDriver(testDriver{devices: []kubeletplugin.DeviceHealth{
		{PoolName: "pool-a", DeviceName: "gpu-0", Health: kubeletplugin.HealthStatusHealthy},
		{PoolName: "pool-a", DeviceName: "gpu-1", Health: kubeletplugin.HealthStatusUnhealthy, Message: "ECC errors"},
	}}, name, testenv.ShortDir(t, "drap"))
	socket := e.regSocket(name, "")
	ps := e.pm.WaitSocket(socket, pluginmanager.StateAnswering)
	want := []api.DRADeviceHealth{{Pool: "pool-a", Device: "gpu-0", Health: "Healthy"}, {Pool: "pool-a", Device: "gpu-1", Health: "Unhealthy", Message: "ECC errors"}}
	e.until("the devices' health in Details", func() bool {
		d, _ := e.observedOf(ps.Plugin)
		return d.HealthService == "v1.DRAResourceHealth" && reflect.DeepEqual(d.Devices, want)
	})
	if n := helper.RegistrationStatus(); n != nil {
		t.Errorf("the plugin was told %+v; want nothing", n)
	}
	helper.Stop()
	e.pm.WaitGone(socket)
	e.until("the stream ended", func() bool {
		e.h.mu.Lock()
		defer e.h.mu.Unlock()
		return len(e.h.followed) == 0
	})
}
