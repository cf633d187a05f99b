package daemon

import (
	"context"
	"path/filepath"
	"sync"
	"testing"

	"github.com/plugd/plugd/api"
	"github.com/plugd/plugd/internal/testenv"
	"github.com/plugd/plugd/plugin"
	"github.com/plugd/plugd/pluginmanager"
)

// greeter is a handler plugd does not ship: it knows nothing of plugd but
// pluginmanager's contract, and counts the registrations of each socket.
type greeter struct {
	mu   sync.Mutex
	held map[string]int // registrations by socket
}

// greeting is what greeter says of a plugin it holds.
type greeting struct {
	Greeted string `json:"greeted"`
	Times   int    `json:"times"`
}

var _ pluginmanager.Detailer = (*greeter)(nil)

func (g *greeter) Validate(context.Context, pluginmanager.Plugin) error { return nil }

func (g *greeter) Register(_ context.Context, p pluginmanager.Plugin) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.held[p.Socket]++
	return nil
}

func (g *greeter) Deregister(_ context.Context, p pluginmanager.Plugin) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.held, p.Socket)
}

func (g *greeter) Details(p pluginmanager.Plugin) any {
	g.mu.Lock()
	defer g.mu.Unlock()
	if n, ok := g.held[p.Socket]; ok {
		return greeting{Greeted: p.Name, Times: n}
	}
	return nil
}

// The status API shows what any pluginmanager.Detailer says of its
// plugins, in the list and for one plugin, and nothing for a handler that
// is not one.
func TestThirdPartyDetails(t *testing.T) {
	r := runDaemon(t, Config{})
	r.d.mu.Lock()
	r.d.useHandler("example.com/Greeter", handler{&greeter{held: map[string]int{}}, func() {}}, pluginmanager.HandlerOptions{})
	r.d.useHandler("example.com/Mute", handler{pluginmanager.HandlerFuncs{}, func() {}}, pluginmanager.HandlerOptions{})
	r.d.mu.Unlock()
	testenv.StartPlugin(t, plugin.Config{Dir: r.dir, Socket: "g.sock", Type: "example.com/Greeter", Name: "g", Versions: []string{"v1"}})
	testenv.StartPlugin(t, plugin.Config{Dir: r.dir, Socket: "m.sock", Type: "example.com/Mute", Name: "m", Versions: []string{"v1"}})

	p := r.waitFor(t, "g.sock", "Registered")
	var got greeting
	if err := p.DecodeDetails(&got); err != nil || got != (greeting{Greeted: "g", Times: 1}) {
		t.Errorf("details of g.sock = %#v (%v); want what its handler says, %+v", p.Details, err, greeting{"g", 1})
	}
	if m := r.waitFor(t, "m.sock", "Registered"); m.Details != nil {
		t.Errorf("details of a plugin whose handler is no Detailer = %#v; want none", m.Details)
	}
	// The node agent is given the very value the handler returned.
	for _, kp := range r.d.kubePlugins() {
		if kp.Path == filepath.Join(r.dir, "g.sock") {
			if d, ok := kp.Details.(greeting); !ok || d.Greeted != "g" || !kp.Answering || kp.Type != "example.com/Greeter" {
				t.Errorf("the node agent's input for g.sock = %+v", kp)
			}
		}
	}
	list, err := r.client.Plugins(context.Background(), api.Filter{Type: "example.com/Greeter"})
	if err != nil || len(list) != 1 {
		t.Fatalf("the Greeter plugins: %+v (%v)", list, err)
	}
	got = greeting{}
	if err := list[0].DecodeDetails(&got); err != nil || got.Greeted != "g" {
		t.Errorf("details of g.sock in the list = %#v (%v)", list[0].Details, err)
	}
}

// A socket is shown by what it said when it says nothing now: the
// engine's LastAnswer for a new file that has not answered, its own last
// answer while it is silent.
func TestIdentify(t *testing.T) {
	const path = "/r/csi.sock"
	said := pluginmanager.Plugin{Type: "CSIPlugin", Name: "csi.example.com", Endpoint: path, Socket: path}
	for _, tc := range []struct {
		name       string
		s          pluginmanager.PluginStatus
		want       string // type/name shown
		remembered bool
	}{
		{"answers now", pluginmanager.PluginStatus{Plugin: said, LastAnswer: said, State: pluginmanager.StateRegistered}, "CSIPlugin/csi.example.com", false},
		{"never answered", pluginmanager.PluginStatus{Plugin: pluginmanager.Plugin{Socket: path}, State: pluginmanager.StatePending}, "/", false},
		{"a new file, silent", pluginmanager.PluginStatus{Plugin: pluginmanager.Plugin{Socket: path}, LastAnswer: said, State: pluginmanager.StateStale}, "CSIPlugin/csi.example.com", true},
		{"stale", pluginmanager.PluginStatus{Plugin: said, LastAnswer: said, State: pluginmanager.StateStale}, "CSIPlugin/csi.example.com", true},
		{"dial failed", pluginmanager.PluginStatus{Plugin: said, LastAnswer: said, State: pluginmanager.StateFailed, Reason: pluginmanager.ReasonDial}, "CSIPlugin/csi.example.com", true},
		{"refused by its handler", pluginmanager.PluginStatus{Plugin: said, LastAnswer: said, State: pluginmanager.StateRejected, Reason: pluginmanager.ReasonValidate}, "CSIPlugin/csi.example.com", false},
		{"unhealthy endpoint", pluginmanager.PluginStatus{Plugin: said, LastAnswer: said, State: pluginmanager.StateUnhealthy, Reason: pluginmanager.ReasonEndpoint}, "CSIPlugin/csi.example.com", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, remembered := identify(tc.s)
			if got := s.Type + "/" + s.Name; got != tc.want || remembered != tc.remembered || s.Socket != path || s.State != tc.s.State {
				t.Errorf("identify = %s %s, remembered %v; want %s, remembered %v", got, s.State, remembered, tc.want, tc.remembered)
			}
		})
	}
}
