package csi_test

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/plugd/plugd/handlers/csi"
	"github.com/plugd/plugd/internal/testenv"
	"github.com/plugd/plugd/pluginmanager"
)

// awaitPoll is the longest a plugin waiting for its endpoint waits between
// two looks at it: registered within it of the endpoint taking connections.
const awaitPoll = 2 * time.Second

// waitsForDriver checks that the registrar r, whose driver's endpoint takes
// no connections, waits for it, untold: its first failure, and its status,
// are Failed, reason endpoint, saying it waits for the endpoint (named),
// looked at again within awaitPoll, and untold.
func waitsForDriver(t *testing.T, hm *harness, r *registrar, endpoint string) {
	t.Helper()
	ev := hm.WaitEvent(r.path, pluginmanager.EventFailed, pluginmanager.EventRegistered)
	if ev.Type != pluginmanager.EventFailed || ev.Reason != pluginmanager.ReasonEndpoint ||
		!strings.Contains(ev.Error, "waiting for its endpoint "+endpoint) {
		t.Errorf("event %+v, want Failed, reason endpoint, waiting for its endpoint %s", ev, endpoint)
	}
	if d := ev.NextRetry.Sub(ev.Time); d <= 0 || d > awaitPoll {
		t.Errorf("looked at again in %s, want within %s", d, awaitPoll)
	}
	if s, ok := hm.Status(driverName); !ok || s.State != pluginmanager.StateFailed || s.Reason != pluginmanager.ReasonEndpoint ||
		!strings.Contains(s.LastError, "waiting for its endpoint "+endpoint) {
		t.Errorf("status %+v (found: %t), want Failed, reason endpoint, waiting for its endpoint", s, ok)
	}
	if told := r.all(); len(told) != 0 {
		t.Fatalf("the registrar was told %v while its driver was down: node-driver-registrar exits when told registered=false", told)
	}
}

// Issue 25, item 1, a first registration: a registrar up before its driver
// (whose socket takes no connections yet) is never told registered=false
// for it (node-driver-registrar exits when told so, and nothing would
// register the driver again): the manager waits for the endpoint, and
// registers the driver, telling the registrar, once it serves.
func TestDriverNotUpYetIsAwaited(t *testing.T) {
	hm := start(t, csi.New(csi.Options{}))
	dir := testenv.ShortDir(t, "csi")
	endpoint := filepath.Join(dir, "csi.sock")
	r := startRegistrar(t, hm.Dir, "", driverName, endpoint, "1.0.0")
	r.exitWhenRefused.Store(true)
	waitsForDriver(t, hm, r, endpoint)

	d := serveDriver(t, dir, driverName)
	r.told(t, true)
	hm.WaitSocket(r.path, pluginmanager.StateRegistered)
	want := wantInstance(r.path, d.path, "1.0.0")
	checkDrivers(t, hm.h.Drivers(), csi.Driver{Name: driverName, Active: want, Instances: []csi.Instance{want}})
	if told := r.all(); len(told) != 1 || !told[0].PluginRegistered {
		t.Errorf("the registrar was told %v, want registered once", told)
	}
}

// Issue 25, item 1, a restart: plugd restarted while a driver is down and
// its registrar, which the previous plugd registered, is up does not tell
// the registrar registered=false either: it waits for the driver, as for a
// first registration.
func TestRestartWithDriverDownIsAwaited(t *testing.T) {
	dir := testenv.ShortDir(t, "csi")
	d := serveDriver(t, dir, driverName)
	first := start(t, csi.New(csi.Options{}))
	r := startRegistrar(t, first.Dir, "", driverName, d.path, "1.0.0")
	r.exitWhenRefused.Store(true)
	r.told(t, true)
	first.WaitSocket(r.path, pluginmanager.StateRegistered)
	first.Stop()
	first.h.Close()
	d.stop()
	r.mu.Lock()
	r.statuses = nil // what the first manager told it
	r.mu.Unlock()

	second := newHarness(t, csi.New(csi.Options{}), pluginmanager.Options{Dir: first.Dir})
	waitsForDriver(t, second, r, d.path)

	serveDriver(t, dir, driverName)
	r.told(t, true)
	second.WaitSocket(r.path, pluginmanager.StateRegistered)
	if ds := second.h.Drivers(); len(ds) != 1 {
		t.Errorf("drivers = %+v, want the driver", ds)
	}
	if told := r.all(); len(told) != 1 || !told[0].PluginRegistered {
		t.Errorf("the second manager told the registrar %v, want registered once", told)
	}
}

// A failure its registrar can fix, or that nobody can, is still told, as
// the kubelet tells it (and node-driver-registrar exits): a driver that
// serves and refuses (not ready), and a refusal whatever the endpoint (no
// version the handler supports, the driver down).
func TestRefusedWithEndpointServingIsToldFalse(t *testing.T) {
	for _, tc := range []struct {
		name     string
		serve    bool
		versions []string
		state    pluginmanager.State
		reason   pluginmanager.Reason
		says     string
	}{
		{"driver serves, not ready", true, []string{"1.0.0"}, pluginmanager.StateFailed, pluginmanager.ReasonRegister, "driver not ready"},
		{"no supported version, driver down", false, []string{"0.3.0"}, pluginmanager.StateRejected, pluginmanager.ReasonValidate, "none of which plugd supports"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hm := start(t, csi.New(csi.Options{}))
			dir := testenv.ShortDir(t, "csi")
			endpoint := filepath.Join(dir, "csi.sock")
			if tc.serve {
				d := serveDriver(t, dir, driverName)
				d.set(func(d *driver) { d.ready = false })
			}
			r := startRegistrar(t, hm.Dir, "", driverName, endpoint, tc.versions...)
			r.exitWhenRefused.Store(true)
			ev := hm.WaitEvent(r.path, pluginmanager.EventFailed, pluginmanager.EventRejected)
			if ev.State != tc.state || ev.Reason != tc.reason || !strings.Contains(ev.Error, tc.says) {
				t.Errorf("event %+v, want %s, reason %s, saying %q", ev, tc.state, tc.reason, tc.says)
			}
			if st := r.told(t, false); !strings.Contains(st.Error, tc.says) {
				t.Errorf("the registrar was told %q, want it to say %q", st.Error, tc.says)
			}
		})
	}
}
