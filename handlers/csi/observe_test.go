package csi_test

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	testingclock "k8s.io/utils/clock/testing"

	"github.com/plugd/plugd/handlers/csi"
	"github.com/plugd/plugd/internal/testenv"
	"github.com/plugd/plugd/pluginmanager"
	"github.com/plugd/plugd/plugintest"
)

// startObserver runs a manager in observe mode with h for CSIPlugin, until
// the end of the test, on a fake clock: it looks again when the test says
// (lookAgain).
func startObserver(t *testing.T, h *csi.Handler) (*harness, *testingclock.FakeClock) {
	t.Helper()
	clk := testingclock.NewFakeClock(time.Now())
	return newHarness(t, h, pluginmanager.Options{Observe: true, ProbeInterval: lookEvery, Clock: clk}), clk
}

// lookEvery is how often an observer looks at each plugin.
const lookEvery = time.Minute

// lookAgain makes the observer look at path once more, and returns the
// event of that look.
func (hm *harness) lookAgain(clk *testingclock.FakeClock, path string) pluginmanager.Event {
	hm.t.Helper()
	clk.Step(plugintest.MaxProbeDelay(lookEvery))
	return hm.WaitLook(path)
}

func jsonOf(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestObserve(t *testing.T) {
	hm, clk := startObserver(t, csi.New(csi.Options{}))
	d := serveDriver(t, testenv.ShortDir(t, "csi"), driverName)
	r := startRegistrar(t, hm.Dir, "", driverName, d.path, "1.0.0")

	s := hm.WaitSocket(r.path, pluginmanager.StateAnswering)
	want := wantInstance(r.path, d.path, "1.0.0")
	want.Observed = true
	checkDrivers(t, hm.h.Drivers(), csi.Driver{Name: driverName, Active: want, Instances: []csi.Instance{want}})
	if got := hm.h.Details(s.Plugin); got == nil || !strings.Contains(jsonOf(t, got), `"nodeID":"node-1"`) || !strings.Contains(jsonOf(t, got), `"observed":true`) {
		t.Errorf("details = %s, want the observed node-1", jsonOf(t, got))
	}

	// Looked at again and again, the registrar is never told anything, and the
	// record stays as it was.
	first := hm.h.Drivers()[0].Active.RegisteredAt
	for i := 2; i <= 4; i++ {
		if ev := hm.lookAgain(clk, r.path); ev.Type != pluginmanager.EventLooked || ev.Attempt != i {
			t.Fatalf("look %d: event %s (attempt %d), want Looked, nothing new", i, ev.Type, ev.Attempt)
		}
	}
	if n := len(r.all()); n != 0 {
		t.Errorf("registrar notified %d times by an observer: %v", n, r.all())
	}
	if got := hm.h.Drivers()[0].Active.RegisteredAt; !got.Equal(first) {
		t.Errorf("first-seen time moved from %s to %s", first, got)
	}
	for _, m := range []string{"GetPluginInfo", "Probe", "NodeGetCapabilities", "NodeGetInfo"} {
		if n := d.called(m); n != 4 {
			t.Errorf("%s called %d times, want one per look", m, n)
		}
	}

	// A driver that is not ready does not answer as it should.
	d.set(func(d *driver) { d.ready = false })
	ev := hm.lookAgain(clk, r.path)
	if ev.Type != pluginmanager.EventNotAnswering || ev.Reason != pluginmanager.ReasonEndpoint || !strings.Contains(ev.Error, "not ready") {
		t.Errorf("look at a driver not ready: %s %s %q, want NotAnswering for the endpoint, saying not ready", ev.Type, ev.Reason, ev.Error)
	}
	if s := hm.WaitSocket(r.path, pluginmanager.StateNotAnswering); s.Reason != pluginmanager.ReasonEndpoint || !strings.Contains(s.LastError, "not ready") {
		t.Errorf("status = %s %q", s.Reason, s.LastError)
	}
	if got := hm.h.Details(r.plugin()); got != nil {
		t.Errorf("details of a driver that does not answer = %s, want nil", jsonOf(t, got))
	}

	// Ready again, it answers again.
	d.set(func(d *driver) { d.ready = true })
	if ev := hm.lookAgain(clk, r.path); ev.Type != pluginmanager.EventAnswering {
		t.Errorf("look at a driver ready again: %s, want Answering", ev.Type)
	}
	if ds := hm.h.Drivers(); len(ds) != 1 || ds[0].Active.NodeID != "node-1" || !ds[0].Active.Observed {
		t.Errorf("drivers = %+v", ds)
	}

	// The registrar goes: the handler forgets the instance.
	r.stop()
	hm.WaitGone(r.path)
	if got := hm.h.Details(r.plugin()); got != nil {
		t.Errorf("details = %s after the socket went, want nil", jsonOf(t, got))
	}
	checkDrivers(t, hm.h.Drivers())
	if n := len(r.all()); n != 0 {
		t.Errorf("registrar notified %d times by an observer: %v", n, r.all())
	}
}

// Observing two live instances of a driver on one endpoint, which Validate
// would refuse, records both; a socket that changes its name is recorded under
// the new one only.
func TestObserveTwoInstances(t *testing.T) {
	ctx := context.Background()
	h := csi.New(csi.Options{})
	defer h.Close()
	regDir := testenv.ShortDir(t, "reg")
	d := serveDriver(t, testenv.ShortDir(t, "csi"), driverName)
	a := pluginmanager.Plugin{Type: csi.Type, Name: driverName, Endpoint: d.path, Versions: []string{"1.0.0"}, Socket: filepath.Join(regDir, "a.sock")}
	b := a
	b.Socket = filepath.Join(regDir, "b.sock")
	for _, p := range []pluginmanager.Plugin{a, b, a} {
		if err := h.Observe(ctx, p); err != nil {
			t.Fatalf("Observe(%s) = %v", p.Socket, err)
		}
	}
	ia, ib := wantInstance(a.Socket, d.path, "1.0.0"), wantInstance(b.Socket, d.path, "1.0.0")
	ia.Observed, ib.Observed = true, true
	// Looking at a again does not make it active: b was first seen later.
	checkDrivers(t, h.Drivers(), csi.Driver{Name: driverName, Active: ib, Instances: []csi.Instance{ia, ib}})

	// A bad announcement is an error naming what is wrong, and drops the record.
	bad := a
	bad.Versions = []string{"0.3.0"}
	if err := h.Observe(ctx, bad); err == nil || !strings.Contains(err.Error(), "none of which plugd supports") {
		t.Errorf("Observe with versions %q = %v", bad.Versions, err)
	}
	checkDrivers(t, h.Drivers(), csi.Driver{Name: driverName, Active: ib, Instances: []csi.Instance{ib}})

	// A name the driver does not answer to names GetPluginInfo.
	other := b
	other.Name = "other.example.com"
	if err := h.Observe(ctx, other); err == nil || !strings.Contains(err.Error(), "GetPluginInfo") {
		t.Errorf("Observe under another name = %v", err)
	}
	checkDrivers(t, h.Drivers())

	h.Forget(b) // nothing left: nothing to do
	if err := h.Observe(ctx, a); err != nil {
		t.Fatal(err)
	}
	renamed := a
	renamed.Name = "Other-Name" // the registrar's name changed; Forget finds the socket anyway
	h.Forget(renamed)
	checkDrivers(t, h.Drivers())
}
