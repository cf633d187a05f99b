package plugintest_test

import (
	"errors"
	"slices"
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
	picky := start(t, plugin.Config{Dir: m.Dir, Type: "example.com/Greeter", Name: "picky"})
	if s := m.WaitState("picky", pluginmanager.StateRejected); s.LastError != "not on the list" {
		t.Errorf("refusal = %q", s.LastError)
	}
	if st, _ := picky.Status(); st.Registered || st.Error != "not on the list" {
		t.Errorf("picky was told %+v", st)
	}

	m.FailRegister("flaky", errors.New("backend down"))
	start(t, plugin.Config{Dir: m.Dir, Type: "example.com/Greeter", Name: "flaky"})
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
