package plugintest

import (
	"context"
	"encoding/json"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/plugd/plugd/pluginmanager"
)

// HandlerCase is a handler under TestHandler: how to make one, and how to
// start plugins it accepts.
type HandlerCase struct {
	// Type is the plugin type the handler serves.
	Type string
	// New returns a fresh handler. If it has a Close method (Close() or
	// Close() error), it is closed at the end of each test, once the
	// manager has stopped.
	New func(t *testing.T) pluginmanager.Handler
	// Start starts a plugin called name that the handler accepts, with its
	// registration socket in dir (its own endpoint may be anywhere), and
	// returns the socket's path and a function that stops the plugin and
	// removes the socket, as a plugin shutting down does. The plugin is
	// stopped at the end of the test if stop was not called.
	Start func(t *testing.T, dir, name string) (socket string, stop func())
	// Refused is a plugin, as its GetInfo would announce it, that the
	// handler's Validate must refuse.
	Refused pluginmanager.Plugin
}

// callBound is how long a handler call may take in TestHandler: a failure
// bound, far above what a call on a local socket takes.
const callBound = 10 * time.Second

// TestHandler checks that a pluginmanager.Handler keeps the contract every
// handler must keep with the manager, as testing/slogtest checks a
// slog.Handler, running the real manager against the real plugins c starts:
//
//   - a plugin it accepts registers, and is let go when its socket goes;
//   - if it is a pluginmanager.Detailer, what Details reports is a JSON
//     object while the plugin is registered, and nil once it is let go;
//   - a plugin restarted in place (a new socket at the same path) is
//     registered again;
//   - plugins registering at once all register (run it with -race);
//   - Validate refuses c.Refused, and again when asked again;
//   - Register with a context already done returns within a bound, and
//     Deregister of a plugin never registered, or deregistered twice,
//     returns and does not panic.
func TestHandler(t *testing.T, c HandlerCase) {
	t.Helper()
	for _, tc := range []struct {
		name string
		run  func(*testing.T, HandlerCase)
	}{
		{"RegistersAndLetsGo", testRegistersAndLetsGo},
		{"RestartedInPlace", testRestartedInPlace},
		{"Concurrent", testConcurrent},
		{"ValidateRefuses", testValidateRefuses},
		{"CallsReturn", testCallsReturn},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, c) })
	}
}

// newHandler makes c's handler, closed at the end of the test.
func newHandler(t *testing.T, c HandlerCase) pluginmanager.Handler {
	t.Helper()
	h := c.New(t)
	switch cl := h.(type) {
	case interface{ Close() }:
		t.Cleanup(cl.Close)
	case interface{ Close() error }:
		t.Cleanup(func() { cl.Close() })
	}
	return h
}

// run makes c's handler and a manager with it, stopped before the handler
// is closed.
func run(t *testing.T, c HandlerCase) (*Manager, pluginmanager.Handler) {
	t.Helper()
	h := newHandler(t, c)
	return NewManagerWith(t, pluginmanager.Options{}, map[string]pluginmanager.Handler{c.Type: h}), h
}

// started runs c.Start, stopping the plugin at the end of the test.
func started(t *testing.T, c HandlerCase, dir, name string) (string, func()) {
	t.Helper()
	socket, stop := c.Start(t, dir, name)
	var once sync.Once
	stopOnce := func() { once.Do(stop) }
	t.Cleanup(stopOnce)
	return socket, stopOnce
}

func testRegistersAndLetsGo(t *testing.T, c HandlerCase) {
	m, h := run(t, c)
	socket, stop := started(t, c, m.Dir, "conformance-a")
	s := m.WaitSocket(socket, pluginmanager.StateRegistered)
	if s.Type != c.Type {
		t.Errorf("registered as type %q, want %q", s.Type, c.Type)
	}
	d, hasDetails := h.(pluginmanager.Detailer)
	if hasDetails {
		got := d.Details(s.Plugin)
		if got == nil {
			t.Errorf("Details of a registered plugin is nil")
		} else if b, err := json.Marshal(got); err != nil || len(b) == 0 || b[0] != '{' {
			t.Errorf("Details of a registered plugin encodes to %s (%v), want a JSON object", b, err)
		}
	}
	stop()
	if _, err := os.Lstat(socket); err == nil {
		// Start's stop must remove the socket; do it for a plugin that does not.
		os.Remove(socket)
	}
	m.WaitGone(socket)
	if hasDetails {
		if got := d.Details(s.Plugin); got != nil {
			t.Errorf("Details after the plugin was let go = %+v, want nil", got)
		}
	}
}

func testRestartedInPlace(t *testing.T, c HandlerCase) {
	m, _ := run(t, c)
	socket, stop := started(t, c, m.Dir, "conformance-b")
	first := m.WaitSocket(socket, pluginmanager.StateRegistered)
	stop()
	again, _ := started(t, c, m.Dir, "conformance-b")
	if again != socket {
		t.Fatalf("the restarted plugin's socket is %s, want the same path %s", again, socket)
	}
	m.Until("the restarted plugin to be registered", func(ps []pluginmanager.PluginStatus) bool {
		s, ok := Find(ps, socket)
		return ok && s.State == pluginmanager.StateRegistered && s.Discovered.After(first.Discovered)
	})
}

func testConcurrent(t *testing.T, c HandlerCase) {
	m, _ := run(t, c)
	// Started one after the other, registered at once: the manager works on
	// several sockets at a time.
	var sockets []string
	for _, name := range []string{"conformance-c0", "conformance-c1", "conformance-c2", "conformance-c3"} {
		socket, _ := started(t, c, m.Dir, name)
		sockets = append(sockets, socket)
	}
	for _, socket := range sockets {
		m.WaitSocket(socket, pluginmanager.StateRegistered)
	}
}

func testValidateRefuses(t *testing.T, c HandlerCase) {
	h := newHandler(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), callBound)
	defer cancel()
	for i := range 2 {
		if err := h.Validate(ctx, c.Refused); err == nil {
			t.Errorf("Validate(%+v) #%d = nil, want it refused", c.Refused, i+1)
		}
	}
}

func testCallsReturn(t *testing.T, c HandlerCase) {
	h := newHandler(t, c)
	dir, err := os.MkdirTemp("", "plugintest")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	socket, _ := started(t, c, dir, "conformance-d")
	// What the manager would hand over: ask the plugin with a manager
	// that has no handler for it.
	m := NewManagerWith(t, pluginmanager.Options{Dir: dir}, nil)
	p := m.WaitSocket(socket, pluginmanager.StateRejected).Plugin
	m.Stop()

	within(t, "Register with a context already done", func() {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_ = h.Register(ctx, p) // an error, or not: the call returns
	})
	within(t, "Deregister", func() {
		h.Deregister(context.Background(), p)
		h.Deregister(context.Background(), p) // twice: nothing to let go
	})
	never := p
	never.Socket = socket + ".never"
	within(t, "Deregister of a plugin never registered", func() { h.Deregister(context.Background(), never) })
}

// within fails the test if call panics or does not return within callBound.
func within(t *testing.T, what string, call func()) {
	t.Helper()
	done := make(chan any, 1)
	go func() {
		defer func() { done <- recover() }()
		call()
	}()
	select {
	case v := <-done:
		if v != nil {
			t.Errorf("%s panicked: %v", what, v)
		}
	case <-time.After(callBound):
		t.Errorf("%s did not return within %s", what, callBound)
	}
}
