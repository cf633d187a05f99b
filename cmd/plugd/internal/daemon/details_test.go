package daemon

import (
	"context"
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
	list, err := r.client.Plugins(context.Background(), api.Filter{Type: "example.com/Greeter"})
	if err != nil || len(list) != 1 {
		t.Fatalf("the Greeter plugins: %+v (%v)", list, err)
	}
	got = greeting{}
	if err := list[0].DecodeDetails(&got); err != nil || got.Greeted != "g" {
		t.Errorf("details of g.sock in the list = %#v (%v)", list[0].Details, err)
	}
}
