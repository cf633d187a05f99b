package hook_test

import (
	"testing"

	"github.com/plugd/plugd/handlers/hook"
	"github.com/plugd/plugd/plugin"
	"github.com/plugd/plugd/pluginmanager"
	"github.com/plugd/plugd/plugintest"
)

// The hook handler keeps the contract of a handler, with a command that
// refuses the plugins called "refused".
func TestConformance(t *testing.T) {
	plugintest.TestHandler(t, plugintest.HandlerCase{
		Type: typ,
		New: func(t *testing.T) pluginmanager.Handler {
			h, err := hook.New(hook.Config{
				Command: []string{"/bin/sh", "-c", `test "$PLUGD_PLUGIN_NAME" != refused`},
				Events:  []string{"validate", "register", "deregister"},
			}, hook.Options{})
			if err != nil {
				t.Fatal(err)
			}
			return h
		},
		Start: func(t *testing.T, dir, name string) (string, func()) {
			s, err := plugin.Start(plugin.Config{Dir: dir, Type: typ, Name: name, Versions: []string{"v1"}})
			if err != nil {
				t.Fatal(err)
			}
			return s.Path(), func() { s.Close() }
		},
		Refused: pluginmanager.Plugin{Type: typ, Name: "refused", Endpoint: "/run/x.sock", Versions: []string{"v1"}, Socket: "/run/reg/refused.sock"},
	})
}
