//go:build unix

package pluginmanager_test

import (
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/plugd/plugd/internal/testenv"
	"github.com/plugd/plugd/plugin"
	"github.com/plugd/plugd/pluginmanager"
	"github.com/plugd/plugd/plugintest"
)

// A socket is known by what GetInfo last answered at its path: while a
// new file there says nothing (a plugin restarted in place, not answering
// yet), its status keeps the one before's answer as LastAnswer; the
// answer of the new file replaces it; a path that goes is forgotten.
func TestLastAnswerOutlivesTheFile(t *testing.T) {
	for _, observe := range []bool{false, true} {
		t.Run(mode(observe), func(t *testing.T) {
			h := start(t, pluginmanager.Options{Observe: observe}, map[string]pluginmanager.Handler{"example.com/Greeter": plugintest.NewRecorder()})
			path := filepath.Join(h.dir, "g.sock")
			testenv.StartPlugin(t, plugin.Config{Dir: h.dir, Socket: "g.sock", Type: "example.com/Greeter", Name: "first"})
			first := h.WaitSocket(path, answered(observe))
			if first.LastAnswer.Name != "first" || first.LastAnswer.Type != "example.com/Greeter" || first.LastAnswer.Endpoint != first.Endpoint {
				t.Fatalf("LastAnswer of a plugin that answered = %+v; want its answer, %+v", first.LastAnswer, first.Plugin)
			}

			// A new file nobody answers on takes the path at once.
			if err := renameOverWith(path, deadSocket); err != nil {
				t.Fatal(err)
			}
			// Observing, a file that refuses is first given time to start
			// listening; managing, it is tried at once.
			looked := func(s pluginmanager.PluginStatus) bool { return observe || s.Attempts > 0 }
			silent := h.find(path, "the new file at the path discovered", func(s pluginmanager.PluginStatus) bool {
				return !s.Created.Equal(first.Created) && looked(s)
			})
			if silent.Type != "" || silent.Name != "" {
				t.Errorf("a file that never answered shows %s %s as its own answer", silent.Type, silent.Name)
			}
			if silent.LastAnswer.Name != "first" || silent.LastAnswer.Socket != path {
				t.Errorf("LastAnswer of the silent file = %+v; want the one before's answer, %+v", silent.LastAnswer, first.Plugin)
			}

			// Its successor answers: its answer is the last one.
			testenv.StartPlugin(t, plugin.Config{Dir: h.dir, Socket: "g.sock", Type: "example.com/Greeter", Name: "second"})
			if s := h.find(path, "the second plugin answered", func(s pluginmanager.PluginStatus) bool {
				return s.Name == "second" && s.State == answered(observe)
			}); s.LastAnswer.Name != "second" {
				t.Errorf("LastAnswer once the new file answered = %+v; want its answer", s.LastAnswer)
			}

			// The path goes, and a file comes back there: nothing is known of it.
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
			h.WaitGone(path)
			if err := deadSocket(path); err != nil {
				t.Fatal(err)
			}
			if s := h.find(path, "the file that came back discovered", looked); s.LastAnswer.Type != "" || s.LastAnswer.Name != "" {
				t.Errorf("LastAnswer of a path that went and came back = %+v; want none", s.LastAnswer)
			}
		})
	}
}

// find waits for the status of the socket at path to be as ok says.
func (h *harness) find(path, what string, ok func(pluginmanager.PluginStatus) bool) pluginmanager.PluginStatus {
	h.t.Helper()
	var got pluginmanager.PluginStatus
	h.Until(what, func(ps []pluginmanager.PluginStatus) bool {
		for _, s := range ps {
			if s.Socket == path && ok(s) {
				got = s
				return true
			}
		}
		return false
	})
	return got
}

// deadSocket is a make for renameOverWith: a socket nobody listens on.
func deadSocket(path string) error {
	l, err := net.Listen("unix", path)
	if err != nil {
		return err
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	return l.Close()
}
