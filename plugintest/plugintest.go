// Package plugintest runs a plugin manager in-process for plugin authors'
// tests, as net/http/httptest runs a server: point your plugin at
// Manager.Dir, then wait for it to register and look at what it sent.
//
//	m := plugintest.NewManager(t, "example.com/Greeter")
//	srv, _ := plugin.Start(plugin.Config{Dir: m.Dir, Type: "example.com/Greeter", Name: "greeter"})
//	p := m.WaitRegistered("greeter")  // what the plugin said in GetInfo
//
// The manager is the real one (package pluginmanager) speaking the kubelet's
// registration protocol over a real unix socket, with a handler that records
// every call and accepts every plugin unless told to refuse one. The authors
// of a handler run the same manager with their own handler through
// NewManagerWith, and wait for a plugin by name (WaitState) or by socket
// (WaitSocket).
package plugintest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/plugd/plugd/pluginmanager"
)

// DefaultTimeout bounds each Wait of a Manager unless Manager.Timeout is set.
const DefaultTimeout = 10 * time.Second

// shutdownWait bounds the wait for the manager to stop at the end of a test.
const shutdownWait = time.Minute

// Call is one call of the recording handler.
type Call struct {
	Op     string // "validate", "register" or "deregister"
	Plugin pluginmanager.Plugin
}

// Manager is a running plugin manager on a temporary registry directory. It
// stops, and the directory is removed, when the test ends. Its Wait methods
// share one event stream: call them from the test's goroutine, one at a
// time; the other methods are safe from any goroutine.
type Manager struct {
	// Dir is the registry directory: the plugin under test puts its
	// registration socket here.
	Dir string
	// Timeout bounds each Wait method; zero means DefaultTimeout.
	Timeout time.Duration

	t   testing.TB
	m   *pluginmanager.Manager
	sub *pluginmanager.Subscription

	mu      sync.Mutex
	calls   []Call
	refuse  map[string]error // by plugin name: Validate's answer
	failReg map[string]error // by plugin name: Register's answer
}

// NewManager starts a manager that accepts plugins of the given types (at
// least one) with a recording handler.
func NewManager(t testing.TB, types ...string) *Manager {
	t.Helper()
	if len(types) == 0 {
		t.Fatal("plugintest.NewManager: name the plugin types to accept, such as \"CSIPlugin\" or your own type")
	}
	mgr := &Manager{refuse: map[string]error{}, failReg: map[string]error{}}
	handlers := make(map[string]pluginmanager.Handler, len(types))
	for _, typ := range types {
		handlers[typ] = recorder{mgr}
	}
	mgr.start(t, pluginmanager.Options{}, handlers)
	return mgr
}

// NewManagerWith starts the real manager with opts and handlers (by plugin
// type, at least one), for the authors of a handler to test it against real
// plugins. It stops when the test ends, as NewManager's does, and fails the
// test if its Run returned an error.
//
// A zero opts.Dir means a fresh, short temporary registry directory, removed
// when the test ends (a unix socket path must be shorter than 108 bytes, and
// t.TempDir's can be longer). A zero BackoffInitial or BackoffMax is
// shortened, as NewManager's are, so that a test sees a retry soon; every
// other zero field keeps the manager's default.
//
// The Wait methods, Status and RemoveSocket work on its manager; the
// recorder's methods (Calls, RefuseValidate and FailRegister) do not: only a
// manager made by NewManager has the recording handler, and on one made by
// NewManagerWith Calls returns nothing and the others have no effect.
func NewManagerWith(t testing.TB, opts pluginmanager.Options, handlers map[string]pluginmanager.Handler) *Manager {
	t.Helper()
	if len(handlers) == 0 {
		t.Fatal("plugintest.NewManagerWith: give at least one handler, by the plugin type it handles")
	}
	mgr := &Manager{refuse: map[string]error{}, failReg: map[string]error{}}
	mgr.start(t, opts, handlers)
	return mgr
}

// start runs the manager for NewManager and NewManagerWith, and returns once
// it has walked its directory for the first time.
func (mgr *Manager) start(t testing.TB, opts pluginmanager.Options, handlers map[string]pluginmanager.Handler) {
	t.Helper()
	mgr.t = t
	if opts.Dir == "" {
		// A unix socket path must be shorter than 108 bytes, and t.TempDir's
		// paths can be longer: keep the registry directory short.
		dir, err := os.MkdirTemp("", "plugintest")
		if err != nil {
			t.Fatalf("plugintest: %v", err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		opts.Dir = dir
	}
	mgr.Dir = opts.Dir
	// A test wants a retry it can see, not one two minutes away.
	if opts.BackoffInitial == 0 {
		opts.BackoffInitial = 50 * time.Millisecond
	}
	if opts.BackoffMax == 0 {
		opts.BackoffMax = time.Second
	}
	var err error
	mgr.m, err = pluginmanager.New(opts)
	if err != nil {
		t.Fatalf("plugintest: %v", err)
	}
	for _, typ := range slices.Sorted(maps.Keys(handlers)) {
		mgr.m.AddHandler(typ, handlers[typ])
	}
	mgr.sub = mgr.m.Subscribe()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.m.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		// Bounded: a handler that ignores its context is the test's failure,
		// not a hang until go test's own timeout.
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("plugintest: manager: %v", err)
			}
		case <-time.After(shutdownWait):
			t.Errorf("plugintest: the manager did not stop within %s of the end of the test", shutdownWait)
		}
	})
	select {
	case <-mgr.m.Synced():
	case err := <-done:
		t.Fatalf("plugintest: manager stopped at start: %v", err)
	}
}

// Manager returns the underlying manager, for its snapshot and events.
func (m *Manager) Manager() *pluginmanager.Manager { return m.m }

// Calls returns the recording handler's calls so far, in order.
func (m *Manager) Calls() []Call {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.calls)
}

// RefuseValidate makes the handler's Validate refuse the plugin called name
// with err, as a handler does when the plugin breaks its rules: the plugin is
// Rejected and told err. A nil err accepts it again (for its next socket).
func (m *Manager) RefuseValidate(name string, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.refuse[name] = err
}

// FailRegister makes the handler's Register fail for the plugin called name
// with err: the plugin is told err and retried after a short backoff, until
// FailRegister(name, nil).
func (m *Manager) FailRegister(name string, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.failReg[name] = err
}

// Status returns what the manager knows of the plugin called name (the most
// recently discovered socket, if it has several).
func (m *Manager) Status(name string) (pluginmanager.PluginStatus, bool) {
	var found pluginmanager.PluginStatus
	ok := false
	for _, s := range m.m.Plugins() {
		if s.Name == name && (!ok || s.Discovered.After(found.Discovered)) {
			found, ok = s, true
		}
	}
	return found, ok
}

// WaitRegistered waits until the plugin called name is registered and returns
// what it sent; it fails the test if that does not happen in time.
func (m *Manager) WaitRegistered(name string) pluginmanager.Plugin {
	m.t.Helper()
	return m.WaitState(name, pluginmanager.StateRegistered).Plugin
}

// WaitState waits until the plugin called name is in state and returns its
// status; it fails the test, with the plugin's last status, if that does not
// happen in time.
func (m *Manager) WaitState(name string, state pluginmanager.State) pluginmanager.PluginStatus {
	m.t.Helper()
	var got pluginmanager.PluginStatus
	err := m.wait(func() bool {
		s, ok := m.Status(name)
		got = s
		return ok && s.State == state
	})
	if err != nil {
		m.t.Fatalf("plugintest: plugin %q is not %s after %s: %v; last status: %+v", name, state, m.timeout(), err, got)
	}
	return got
}

// WaitSocket waits until the plugin whose registration socket is at path is
// in state and returns its status, as WaitState does for a plugin by name; it
// fails the test, with the socket's last status, if that does not happen in
// time. Use it when several sockets carry one plugin name, or when the test
// knows the socket rather than the name.
func (m *Manager) WaitSocket(path string, state pluginmanager.State) pluginmanager.PluginStatus {
	m.t.Helper()
	var got pluginmanager.PluginStatus
	err := m.wait(func() bool {
		for _, s := range m.m.Plugins() {
			if s.Socket == path {
				got = s
				return s.State == state
			}
		}
		got = pluginmanager.PluginStatus{}
		return false
	})
	if err != nil {
		m.t.Fatalf("plugintest: the socket %s is not %s after %s: %v; last status: %+v", path, state, m.timeout(), err, got)
	}
	return got
}

// RemoveSocket removes the registration socket of the plugin called name, as
// a crashed plugin's cleanup or an operator would, and waits until the
// manager has let the plugin go.
func (m *Manager) RemoveSocket(name string) {
	m.t.Helper()
	s, ok := m.Status(name)
	if !ok {
		m.t.Fatalf("plugintest: RemoveSocket: no plugin %q is known", name)
	}
	if err := os.Remove(s.Socket); err != nil {
		m.t.Fatalf("plugintest: RemoveSocket: %v", err)
	}
	err := m.wait(func() bool {
		for _, p := range m.m.Plugins() {
			if p.Socket == s.Socket {
				return false
			}
		}
		return true
	})
	if err != nil {
		m.t.Fatalf("plugintest: the manager still knows %s after %s", s.Socket, m.timeout())
	}
}

// wait re-checks cond on every event until it holds or the timeout passes.
func (m *Manager) wait(cond func() bool) error {
	timer := time.NewTimer(m.timeout())
	defer timer.Stop()
	for !cond() {
		select {
		case _, ok := <-m.sub.Events():
			if !ok {
				return errors.New("the manager stopped")
			}
		case <-timer.C:
			return fmt.Errorf("timed out")
		}
	}
	return nil
}

func (m *Manager) timeout() time.Duration {
	if m.Timeout > 0 {
		return m.Timeout
	}
	return DefaultTimeout
}

// recorder is the handler: it records, and answers as the Manager was told.
type recorder struct{ m *Manager }

func (r recorder) record(op string, p pluginmanager.Plugin) {
	r.m.mu.Lock()
	defer r.m.mu.Unlock()
	r.m.calls = append(r.m.calls, Call{Op: op, Plugin: p})
}

func (r recorder) Validate(_ context.Context, p pluginmanager.Plugin) error {
	r.record("validate", p)
	r.m.mu.Lock()
	defer r.m.mu.Unlock()
	return r.m.refuse[p.Name]
}

func (r recorder) Register(_ context.Context, p pluginmanager.Plugin) error {
	r.record("register", p)
	r.m.mu.Lock()
	defer r.m.mu.Unlock()
	return r.m.failReg[p.Name]
}

func (r recorder) Deregister(_ context.Context, p pluginmanager.Plugin) {
	r.record("deregister", p)
}
