package pluginmanager_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/plugd/plugd/internal/testenv"
	"github.com/plugd/plugd/plugin"
	"github.com/plugd/plugd/pluginmanager"
	"github.com/plugd/plugd/plugintest"
)

// A registered plugin killed, its socket left behind, keeps what it last
// said through Unhealthy, its deregistration and Stale: an operator still
// finds it by type and name.
func TestStaleSocketKeepsItsIdentity(t *testing.T) {
	const grace = time.Minute
	clk := fakeClock()
	h := start(t, pluginmanager.Options{Clock: clk}, nil)
	h.m.AddHandler("CSIPlugin", plugintest.NewRecorder(), pluginmanager.HandlerOptions{UnhealthyGrace: grace})
	path := filepath.Join(h.dir, "killed.sock")
	kill := serveLeaving(t, path, &moody{info: &registerapi.PluginInfo{Type: "CSIPlugin", Name: "killed", SupportedVersions: []string{"1.0.0"}}})
	h.WaitSocket(path, pluginmanager.StateRegistered)
	kill()
	h.WaitEvent(path, pluginmanager.EventUnhealthy)
	clk.Step(grace)
	h.WaitEvent(path, pluginmanager.EventDeregistered)
	clk.Step(time.Second) // past the first retry, which finds nobody listening
	s := h.WaitSocket(path, pluginmanager.StateStale)
	if s.Type != "CSIPlugin" || s.Name != "killed" || len(s.Versions) != 1 {
		t.Errorf("the stale socket's status %+v forgot what the plugin said", s)
	}
	if got, ok := h.Status("killed"); !ok || got.Socket != path {
		t.Errorf("the stale plugin is not found by its name: %+v", got)
	}
}

// A Rejected plugin that then exits, leaving its socket (node-driver-
// registrar does, told it is not registered), is removed once
// Options.RemoveStaleAfter has passed; one that still listens is kept.
func TestRemoveStaleAfterCoversRejected(t *testing.T) {
	const after = time.Hour
	clk := fakeClock()
	h := start(t, pluginmanager.Options{RemoveStaleAfter: after, Clock: clk}, nil)
	h.m.AddHandler("CSIPlugin", pluginmanager.HandlerFuncs{
		ValidateFunc: func(_ context.Context, p pluginmanager.Plugin) error { return errors.New("not on the list") },
	})
	gone := filepath.Join(h.dir, "gone.sock")
	kill := serveLeaving(t, gone, &moody{info: &registerapi.PluginInfo{Type: "CSIPlugin", Name: "gone", SupportedVersions: []string{"1.0.0"}}})
	h.WaitSocket(gone, pluginmanager.StateRejected)
	kill()
	listening := testenv.StartPlugin(t, plugin.Config{Dir: h.dir, Type: "CSIPlugin", Name: "listening", Versions: []string{"1.0.0"}})
	h.WaitSocket(listening.Path(), pluginmanager.StateRejected)

	clk.Step(after + time.Second) // the socket's birth time is the real clock's, a moment after the fake one started
	h.WaitGone(gone)
	if _, ok := statPath(gone); ok {
		t.Error("the rejected plugin's socket, nobody listening, is still there")
	}
	clk.Step(after)
	clk.Step(after)
	h.WaitSocket(listening.Path(), pluginmanager.StateRejected)
	if _, ok := statPath(listening.Path()); !ok {
		t.Error("the socket of a rejected plugin that still listens was removed")
	}
}

// Issue 33, item 12: every event carries the socket's state after it. A
// registered plugin whose socket goes is Deregistered, with no state, and
// Removed, with none either: not the Registered it was in.
func TestRemovedCarriesNoState(t *testing.T) {
	h := start(t, pluginmanager.Options{}, map[string]pluginmanager.Handler{"CSIPlugin": plugintest.NewRecorder()})
	p := testenv.StartPlugin(t, plugin.Config{Dir: h.dir, Type: "CSIPlugin", Name: "gone.example.com"})
	h.WaitSocket(p.Path(), pluginmanager.StateRegistered)
	p.Close()
	for _, typ := range []pluginmanager.EventType{pluginmanager.EventDeregistered, pluginmanager.EventRemoved} {
		ev := h.WaitEvent(p.Path(), typ)
		if ev.State != "" || ev.Reason != "" || ev.Plugin.Name != "gone.example.com" {
			t.Errorf("%s: state %q, reason %q, plugin %+v; want no state, and the plugin it was", typ, ev.State, ev.Reason, ev.Plugin)
		}
	}
}
