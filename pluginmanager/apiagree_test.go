package pluginmanager

import (
	"slices"
	"testing"

	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/plugd/plugd/api"
)

// The status API (package api, which imports nothing of the engine) names
// the engine's states, event types and reasons: the same sets, in the same
// order for the states.
func TestAPIAgreesWithTheEngine(t *testing.T) {
	var states []string
	for _, s := range append((&registrar{}).states(), (&onlooker{}).states()...) {
		if !slices.Contains(states, string(s)) {
			states = append(states, string(s))
		}
	}
	if got := api.States(); !sameSet(got, states) {
		t.Errorf("api.States() = %v, want the engine's %v", got, states)
	}
	order := []State{StatePending, StateRegistering, StateRegistered, StateFailed, StateStale, StateRejected, StateUnhealthy, StateAnswering, StateNotAnswering}
	for i, s := range api.States() {
		if i < len(order) && s != string(order[i]) {
			t.Errorf("api.States()[%d] = %s, want %s: from the happy path to trouble", i, s, order[i])
		}
	}
	events := []EventType{EventDiscovered, EventRegistered, EventFailed, EventRejected, EventDeregistered, EventUnhealthy, EventHealthy,
		EventAnswering, EventNotAnswering, EventLooked, EventRemoved, EventLost}
	if got := api.EventTypes(); !sameSet(got, strs(events)) {
		t.Errorf("api.EventTypes() = %v, want the engine's %v", got, events)
	}
	reasons := []Reason{ReasonDial, ReasonGetInfo, ReasonInvalidInfo, ReasonNoHandler, ReasonValidate, ReasonRegister, ReasonNotify,
		ReasonPolicy, ReasonUnhealthy, ReasonEndpoint}
	if got := api.Reasons(); !sameSet(got, strs(reasons)) {
		t.Errorf("api.Reasons() = %v, want the engine's %v", got, reasons)
	}
	// A slice handed out is the caller's.
	api.States()[0] = "changed"
	if api.States()[0] != api.StatePending {
		t.Error("api.States() hands out a shared slice")
	}
}

func strs[S ~string](ss []S) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = string(s)
	}
	return out
}

func sameSet(a, b []string) bool {
	a, b = slices.Sorted(slices.Values(a)), slices.Sorted(slices.Values(b))
	return slices.Equal(a, b)
}

// api's plugin types are the kubelet's, as its registration API spells
// them: api needs the standard library only, so it cannot use those.
func TestAPIPluginTypesAreTheKubelets(t *testing.T) {
	for got, want := range map[string]string{api.CSIPlugin: registerapi.CSIPlugin, api.DRAPlugin: registerapi.DRAPlugin, api.DevicePlugin: registerapi.DevicePlugin} {
		if got != want {
			t.Errorf("api has %q, the kubelet %q", got, want)
		}
	}
}
