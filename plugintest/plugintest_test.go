package plugintest_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/plugd/plugd/plugin"
	"github.com/plugd/plugd/pluginmanager"
	"github.com/plugd/plugd/plugintest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func start(t *testing.T, cfg plugin.Config) *plugin.Server {
	t.Helper()
	s, err := plugin.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestRegisterRefuseFailRemove(t *testing.T) {
	m := plugintest.NewManager(t, "example.com/Greeter")
	srv := start(t, plugin.Config{Dir: m.Dir, Type: "example.com/Greeter", Name: "greeter", Versions: []string{"v1"}})
	p := m.WaitRegistered("greeter")
	if p.Type != "example.com/Greeter" || p.Endpoint != srv.Path() || !slices.Equal(p.Versions, []string{"v1"}) {
		t.Errorf("registered %+v", p)
	}
	if !srv.Registered() {
		t.Error("the plugin was not told it is registered")
	}

	m.RefuseValidate("picky", errors.New("not on the list"))
	picky := start(t, plugin.Config{Dir: m.Dir, Type: "example.com/Greeter", Name: "picky", Versions: []string{"v1"}})
	if s := m.WaitState("picky", pluginmanager.StateRejected); s.LastError != "not on the list" {
		t.Errorf("refusal = %q", s.LastError)
	}
	if st, _ := picky.Status(); st.Registered || st.Error != "not on the list" {
		t.Errorf("picky was told %+v", st)
	}

	m.FailRegister("flaky", errors.New("backend down"))
	start(t, plugin.Config{Dir: m.Dir, Type: "example.com/Greeter", Name: "flaky", Versions: []string{"v1"}})
	m.WaitState("flaky", pluginmanager.StateFailed)
	m.FailRegister("flaky", nil)
	m.WaitRegistered("flaky")

	m.RemoveSocket("greeter")
	var ops []string
	for _, c := range m.Calls() {
		if c.Plugin.Name == "greeter" {
			ops = append(ops, c.Op)
		}
	}
	if !slices.Equal(ops, []string{"validate", "register", "deregister"}) {
		t.Errorf("calls for greeter = %q", ops)
	}
}

// gate is a handler of a plugin author's own: it refuses plugins called
// "bad" and counts registrations.
type gate struct {
	mu         sync.Mutex
	registered []string
}

func (g *gate) Validate(_ context.Context, p pluginmanager.Plugin) error {
	if p.Name == "bad" {
		return errors.New("bad by name")
	}
	return nil
}

func (g *gate) Register(_ context.Context, p pluginmanager.Plugin) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.registered = append(g.registered, p.Name)
	return nil
}

func (g *gate) Deregister(context.Context, pluginmanager.Plugin) {}

func TestNewManagerWith(t *testing.T) {
	g := &gate{}
	m := plugintest.NewManagerWith(t, pluginmanager.Options{}, map[string]pluginmanager.Handler{"example.com/Gate": g})
	if m.Dir == "" {
		t.Fatal("no registry directory")
	}
	good := start(t, plugin.Config{Dir: m.Dir, Type: "example.com/Gate", Name: "good", Versions: []string{"v1"}})
	bad := start(t, plugin.Config{Dir: m.Dir, Type: "example.com/Gate", Name: "bad", Versions: []string{"v1"}})

	if s := m.WaitSocket(good.Path(), pluginmanager.StateRegistered); s.Name != "good" || s.Socket != good.Path() {
		t.Errorf("good: %+v", s)
	}
	if s := m.WaitSocket(bad.Path(), pluginmanager.StateRejected); s.LastError != "bad by name" {
		t.Errorf("bad: %+v", s)
	}
	g.mu.Lock()
	if !slices.Equal(g.registered, []string{"good"}) {
		t.Errorf("registered %q", g.registered)
	}
	g.mu.Unlock()
}

// A Recorder works beside an author's handler: the Manager's recorder
// methods are its.
func TestNewManagerWithARecorder(t *testing.T) {
	rec := plugintest.NewRecorder()
	m := plugintest.NewManagerWith(t, pluginmanager.Options{}, map[string]pluginmanager.Handler{"example.com/Gate": &gate{}, "example.com/Rec": rec})
	m.RefuseValidate("no", errors.New("refused"))
	yes := start(t, plugin.Config{Dir: m.Dir, Type: "example.com/Rec", Name: "yes", Versions: []string{"v1"}})
	no := start(t, plugin.Config{Dir: m.Dir, Type: "example.com/Rec", Name: "no", Versions: []string{"v1"}})
	m.WaitSocket(yes.Path(), pluginmanager.StateRegistered)
	m.WaitSocket(no.Path(), pluginmanager.StateRejected)
	m.WaitCalls("register", "yes", 1)
	if p, ok := rec.Holds(yes.Path()); !ok || p.Name != "yes" {
		t.Errorf("the recorder holds %+v (%v) for yes", p, ok)
	}
	if rec.Count("validate", "no") != 1 || rec.Count("register", "no") != 0 {
		t.Errorf("calls = %+v", m.Calls())
	}
	yes.Close()
	m.WaitGone(yes.Path())
	if _, ok := rec.Holds(yes.Path()); ok || rec.Count("deregister", "yes") != 1 {
		t.Errorf("after the socket went, calls = %+v", m.Calls())
	}
}

// The Recorder keeps the contract of a handler.
func TestRecorderPassesTestHandler(t *testing.T) {
	plugintest.TestHandler(t, plugintest.HandlerCase{
		Type: "example.com/Greeter",
		New: func(*testing.T) pluginmanager.Handler {
			r := plugintest.NewRecorder()
			r.RefuseValidate("refused", errors.New("not on the list"))
			return r
		},
		Start: func(t *testing.T, dir, name string) (string, func()) {
			s := start(t, plugin.Config{Dir: dir, Type: "example.com/Greeter", Name: name, Versions: []string{"v1"}})
			return s.Path(), func() { s.Close() }
		},
		Refused: pluginmanager.Plugin{Type: "example.com/Greeter", Name: "refused", Socket: "/nowhere.sock"},
	})
}
