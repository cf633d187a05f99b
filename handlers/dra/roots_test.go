package dra

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/plugd/plugd/internal/testenv"
	"github.com/plugd/plugd/pluginmanager"
)

// Issue 13, item 3: an endpoint inside the endpoint roots that is swapped for
// a symlink to a socket outside them after registration does not lead the
// handler's reconnections out: every connection is checked again.
func TestReconnectStaysInEndpointRoots(t *testing.T) {
	base := testenv.ShortDir(t, "drr")
	root, outside := filepath.Join(base, "root"), filepath.Join(base, "out")
	for _, d := range []string{root, outside} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	l := newLogs()
	e := &env{t: t}
	e.h = New(Options{Logger: slog.New(l), EndpointRoots: []string{root}})
	e.run(pluginmanager.Options{BackoffInitial: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond, EndpointRoots: []string{root}})
	const name = "roots.example.com"
	svc := e.startDriver(testDriver{}, name, root, kubeletplugin.RegistrationService(false))
	e.startDriver(testDriver{}, name, root, kubeletplugin.DRAService(false))
	socket := e.regSocket(name, "")
	ps := e.pm.WaitSocket(socket, pluginmanager.StateRegistered)
	e.driverWhen(name, "to be connected", func(d Driver) bool { return len(d.Instances) == 1 && d.Instances[0].Connected })

	// The driver goes, and its endpoint becomes a symlink to a socket
	// outside the roots.
	svc.Stop()
	e.driverWhen(name, "to lose its connection", func(d Driver) bool { return len(d.Instances) == 1 && !d.Instances[0].Connected })
	evil := testenv.CountAccepts(t, filepath.Join(outside, "evil.sock"))
	os.Remove(ps.Endpoint)
	if err := os.Symlink(filepath.Join(outside, "evil.sock"), ps.Endpoint); err != nil {
		t.Fatal(err)
	}

	const msg = "DRA endpoint now leads outside the allowed directories; not connecting to it"
	deadline := time.After(testenv.Timeout)
	for {
		found, changed := l.find(msg)
		if len(found) > 0 {
			break
		}
		select {
		case <-evil.Connected:
			t.Fatalf("the handler reconnected to %s, outside the endpoint roots", filepath.Join(outside, "evil.sock"))
		case <-changed:
			continue
		case <-deadline:
			t.Fatalf("the handler neither reconnected nor refused within %s", testenv.Timeout)
		}
	}
	if n := evil.Count(); n != 0 {
		t.Errorf("the socket outside the roots was connected to %d times", n)
	}
	if d, _ := e.driver(name); d.Instances[0].Connected {
		t.Errorf("the instance is connected: %+v", d)
	}
}
