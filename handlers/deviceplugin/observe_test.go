package deviceplugin_test

import (
	"context"
	"encoding/json"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	testingclock "k8s.io/utils/clock/testing"

	plugdapi "github.com/plugd/plugd/api"
	"github.com/plugd/plugd/handlers/deviceplugin"
	"github.com/plugd/plugd/internal/testenv"
	"github.com/plugd/plugd/plugin"
	"github.com/plugd/plugd/pluginmanager"
	"github.com/plugd/plugd/plugintest"
)

// newObserveEnv is newEnv with the manager in observe mode, on a fake
// clock: it looks again when the test says (looks).
func newObserveEnv(t *testing.T) *env {
	t.Helper()
	e := &env{t: t, reg: prometheus.NewPedanticRegistry(), clk: testingclock.NewFakeClock(time.Now())}
	e.h = deviceplugin.New(deviceplugin.Options{Registerer: e.reg})
	// Registered first, so run last: after the manager has stopped.
	t.Cleanup(func() {
		e.h.Close()
		if e.sub != nil {
			e.sub.Close()
		}
	})
	e.startManager(pluginmanager.Options{Observe: true, ProbeInterval: lookEvery, Clock: e.clk})
	return e
}

// lookEvery is how often the observer looks at each plugin.
const lookEvery = time.Minute

// observedDetails is Details of an observed plugin as plugd's status API
// encodes it.
type observedDetails struct {
	Resource   string                `json:"resource"`
	Endpoint   string                `json:"endpoint"`
	Observed   bool                  `json:"observed"`
	Devices    map[string]int        `json:"devices"`
	Inventory  []deviceplugin.Device `json:"inventory"`
	LastError  string                `json:"lastError"`
	ObservedAt time.Time             `json:"observedAt"`
}

func (e *env) observed(p pluginmanager.Plugin) (observedDetails, bool) {
	e.t.Helper()
	d := e.h.Details(p)
	if d == nil {
		return observedDetails{}, false
	}
	b, err := json.Marshal(d)
	if err != nil {
		e.t.Fatal(err)
	}
	var out observedDetails
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

// In observe mode the handler reads a device plugin's inventory once per
// look, never keeps its stream, and the plugin is never told anything.
func TestObserve(t *testing.T) {
	e := newObserveEnv(t)
	dp := newDevicePlugin(dev("gpu-1", "Broken"), dev("gpu-0", api.Healthy, 0))
	endpoint := filepath.Join(testenv.ShortDir(t, "dpe"), "gpu.sock")
	srv := serveEndpoint(t, endpoint, dp)
	reg := e.startPlugin(plugin.Config{Name: gpu, Socket: "gpu.sock", Endpoint: endpoint})

	ps := e.pm.WaitSocket(reg.Path(), pluginmanager.StateAnswering)
	d, ok := e.observed(ps.Plugin)
	if !ok {
		t.Fatalf("no details of %s once it answers", reg.Path())
	}
	want := []deviceplugin.Device{{ID: "gpu-0", Health: api.Healthy, Topology: []int64{0}}, {ID: "gpu-1", Health: api.Unhealthy}}
	if !d.Observed || d.Resource != gpu || d.Endpoint != endpoint || d.LastError != "" || d.ObservedAt.IsZero() ||
		!reflect.DeepEqual(d.Inventory, want) || !reflect.DeepEqual(d.Devices, map[string]int{api.Healthy: 1, api.Unhealthy: 1}) {
		t.Errorf("details = %+v, want the observed inventory %+v", d, want)
	}

	// Looking is reading: the plugin is never notified, no stream stays
	// open, and the handler serves no resource.
	e.looks(reg.Path(), 3)
	if n := reg.Notifications(); n != 0 {
		t.Errorf("the plugin was notified %d times, want none", n)
	}
	dp.waitIdle(t)
	if rs := e.h.Resources(); len(rs) != 0 {
		t.Errorf("resources = %+v, want none in observe mode", rs)
	}
	// A later look sees a changed inventory.
	dp.set(dev("gpu-0", api.Unhealthy))
	e.looks(reg.Path(), 2)
	if d, _ := e.observed(ps.Plugin); len(d.Inventory) != 1 || d.Devices[api.Unhealthy] != 1 {
		t.Errorf("details = %+v, want the new inventory", d)
	}

	// The device service stops while the registration socket still answers.
	srv.Stop()
	if ev := e.looks(reg.Path(), 1); ev.Type != pluginmanager.EventNotAnswering {
		t.Errorf("the look after the service stopped: %s, want NotAnswering", ev.Type)
	}
	ps = e.pm.WaitSocket(reg.Path(), pluginmanager.StateNotAnswering)
	// Two signals say so, in either order: the endpoint watch's hang-up,
	// and the look's call that fails. Either names the endpoint.
	if ps.Reason != pluginmanager.ReasonEndpoint || !strings.Contains(ps.LastError, endpoint) ||
		!strings.Contains(ps.LastError, "GetDevicePluginOptions") && !strings.Contains(ps.LastError, "watching the idle connection") {
		t.Errorf("status = %+v, want reason endpoint naming the endpoint and the call that failed, or its hang-up", ps)
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
		t.Errorf("details after the socket went = %+v, want nil", d)
	}
}

// A look that fails lets go of the last look's watch of the endpoint, whose
// reports the manager no longer heeds, and keeps the inventory it saw when
// the plugin's name is the same. Under another name, the last look's record
// goes, and its watch with it: none is left behind once Forget is called.
func TestObserveFailedLetsTheLastWatchGo(t *testing.T) {
	h := deviceplugin.New(deviceplugin.Options{})
	t.Cleanup(h.Close)
	endpoint := filepath.Join(testenv.ShortDir(t, "dpe"), "gpu.sock")
	srv := serveEndpoint(t, endpoint, newDevicePlugin(dev("gpu-0", api.Healthy)))
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout)
	defer cancel()
	p := pluginmanager.Plugin{Type: deviceplugin.Type, Name: gpu, Endpoint: endpoint, Versions: []string{"v1beta1"}, Socket: "/reg/gpu.sock"}
	observe := func(p pluginmanager.Plugin, ok bool) {
		t.Helper()
		if err := h.Observe(ctx, p); (err == nil) != ok {
			t.Fatalf("Observe(%s, %q) = %v, want success %v", p.Name, p.Versions, err, ok)
		}
	}
	observe(p, true)
	srv.WaitConns(t, 1, testenv.Timeout) // the watch's

	bad := p
	bad.Versions = []string{"v1alpha"}
	observe(bad, false)
	srv.WaitConns(t, 0, testenv.Timeout)
	if d, ok := h.Details(p).(plugdapi.DevicePluginObserved); !ok || len(d.Inventory) != 1 || !strings.Contains(d.LastError, "v1alpha") {
		t.Errorf("details after a failed look = %+v, want the inventory kept, and the look's error", h.Details(p))
	}

	observe(p, true)
	srv.WaitConns(t, 1, testenv.Timeout)
	other := bad
	other.Name = "example.com/other"
	observe(other, false)
	h.Forget(other)
	srv.WaitConns(t, 0, testenv.Timeout)
	if d := h.Details(p); d != nil {
		t.Errorf("details of %s = %+v, want none once its socket showed another plugin", p.Name, d)
	}
}
