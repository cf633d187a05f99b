package plugintest_test

import (
	"errors"
	"testing"

	"github.com/plugd/plugd/plugin"
	"github.com/plugd/plugd/pluginmanager"
	"github.com/plugd/plugd/plugintest"
)

// A plugin author's test: does my plugin register, with what, and does it
// cope with being refused?
func ExampleNewManager() {
	_ = func(t *testing.T) {
		m := plugintest.NewManager(t, "example.com/Greeter")

		srv, err := plugin.Start(plugin.Config{Dir: m.Dir, Type: "example.com/Greeter", Name: "greeter.example.com", Versions: []string{"v1"}})
		if err != nil {
			t.Fatal(err)
		}
		defer srv.Close()
		if p := m.WaitRegistered("greeter.example.com"); p.Versions[0] != "v1" {
			t.Errorf("registered with versions %v", p.Versions)
		}

		// Registration refused on purpose: the plugin must hear why.
		m.RefuseValidate("picky.example.com", errors.New("not on the list"))
		picky, err := plugin.Start(plugin.Config{Dir: m.Dir, Type: "example.com/Greeter", Name: "picky.example.com", Versions: []string{"v1"}})
		if err != nil {
			t.Fatal(err)
		}
		defer picky.Close()
		m.WaitState("picky.example.com", pluginmanager.StateRejected)
		if st, _ := picky.Status(); st.Error != "not on the list" {
			t.Errorf("the plugin was told %q", st.Error)
		}
	}
}
