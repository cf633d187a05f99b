package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/plugd/plugd/api"
	"github.com/plugd/plugd/internal/testenv"
	"github.com/plugd/plugd/pluginmanager"
)

// An observing plugd beside the manager that registers (here a pluginmanager
// in the test, standing in for a kubelet): each plugin is told once, by its
// manager; plugd reports each, what it said and whether it answers; a killed
// plugin is reported not answering within a probe interval; a removed one
// disappears.
func TestObserveBesideAManager(t *testing.T) {
	dir := testenv.ShortDir(t, "obs")
	reg := filepath.Join(dir, "reg")
	if err := os.Mkdir(reg, 0o750); err != nil {
		t.Fatal(err)
	}

	// The registering manager.
	owner, err := pluginmanager.New(pluginmanager.Options{Dir: reg})
	if err != nil {
		t.Fatal(err)
	}
	owner.AddHandler("example.com/Greeter", pluginmanager.HandlerFuncs{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- owner.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("the registering manager: %v", err)
		}
	})

	// The observer: plugd, looking every 200ms.
	n := &node{dir: dir, reg: reg, socket: filepath.Join(dir, "plugd.sock")}
	n.plugd = start(t, "plugd", "--mode=observe", "--registry-dir", reg, "--status-socket", n.socket, "--probe-interval", "200ms")
	n.client = &api.Client{Socket: n.socket}
	n.waitReady(t, 10*time.Millisecond)

	a := n.plugin(t, "-name", "a.example.com")
	b := n.plugin(t, "-name", "b.example.com")
	for _, name := range []string{"a.example.com", "b.example.com"} {
		if out, code := plugctl(t, n.socket, "wait", "--name", name, "--for", "answering", "--timeout", "15s"); code != 0 {
			t.Fatalf("wait for %s to answer = %d: %s", name, code, out)
		}
	}
	out, _ := plugctl(t, n.socket, "get", "a.example.com.sock", "-o", "json")
	if !strings.Contains(out, `"type": "example.com/Greeter"`) || !strings.Contains(out, `"state": "Answering"`) {
		t.Errorf("plugd observed:\n%s", out)
	}

	// Several looks later (each look is an event), each was told exactly
	// once, by the registering manager.
	ctx, stop := context.WithTimeout(context.Background(), testenv.Timeout)
	defer stop()
	events, err := n.client.Events(ctx, 1000)
	if err != nil {
		t.Fatal(err)
	}
	defer events.Close()
	looks := map[string]int{}
	for looks["a.example.com.sock"] < 3 || looks["b.example.com.sock"] < 3 {
		ev, err := events.Next()
		if err != nil {
			t.Fatalf("plugd looked at the plugins %v times, then the event stream ended: %v", looks, err)
		}
		switch ev.Type {
		case api.EventAnswering, api.EventNotAnswering, api.EventLooked:
			looks[ev.Plugin.ID]++
		}
	}
	for _, p := range []*proc{a, b} {
		if got := strings.Count(p.out.String(), "plugin registered by manager"); got != 1 {
			t.Errorf("a plugin was told %d times it is registered, want once:\n%s", got, p.out)
		}
		if strings.Contains(p.out.String(), "rejected by manager") {
			t.Errorf("a plugin was told it was not registered:\n%s", p.out)
		}
	}

	// Killed: its socket stays, nobody answers.
	killed := time.Now()
	a.cmd.Process.Signal(syscall.SIGKILL)
	a.wait(t)
	// plugd's own event says when it saw the plugin stop answering, so that
	// starting plugctl on a busy machine is not counted. The stream's
	// deadline (testenv.Timeout) is far shorter than the default probe
	// interval (5 minutes): a plugd that did not apply --probe-interval
	// fails here.
	for {
		ev, err := events.Next()
		if err != nil {
			t.Fatalf("no NotAnswering event for the killed plugin: %v", err)
		}
		if ev.Type == api.EventNotAnswering && ev.Plugin.ID == "a.example.com.sock" && !ev.Time.Before(killed) {
			t.Logf("plugd saw the killed plugin stop answering %s after the kill (probe interval 200ms)", ev.Time.Sub(killed).Round(time.Millisecond))
			break
		}
	}
	if out, code := plugctl(t, n.socket, "wait", "--name", "a.example.com", "--for", "stale", "--timeout", "15s"); code != 0 {
		t.Fatalf("wait for the killed plugin = %d: %s", code, out)
	}
	os.Remove(filepath.Join(reg, "a.example.com.sock")) // what its restart would do

	// Removed: gone from the observer too.
	if code := b.stop(t, syscall.SIGTERM); code != 0 {
		t.Errorf("plugin exit %d", code)
	}
	if out, code := plugctl(t, n.socket, "wait", "--name", "b.example.com", "--for", "gone", "--timeout", "15s"); code != 0 {
		t.Fatalf("wait --for gone = %d: %s", code, out)
	}
	if code := n.plugd.stop(t, syscall.SIGTERM); code != 0 {
		t.Errorf("plugd exit %d:\n%s", code, n.plugd.out)
	}
}
