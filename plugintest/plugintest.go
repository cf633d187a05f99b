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
// every call and accepts every plugin unless told to refuse one.
package plugintest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/plugd/plugd/pluginmanager"
)

// DefaultTimeout bounds each Wait of a Manager unless Manager.Timeout is set.
const DefaultTimeout = 10 * time.Second

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
	// A unix socket path must be shorter than 108 bytes, and t.TempDir's
	// paths can be longer: keep the registry directory short.
	dir, err := os.MkdirTemp("", "plugintest")
	if err != nil {
		t.Fatalf("plugintest: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })

	mgr := &Manager{Dir: dir, t: t, refuse: map[string]error{}, failReg: map[string]error{}}
	mgr.m, err = pluginmanager.New(pluginmanager.Options{
		Dir: dir,
		// A test wants a retry it can see, not one two minutes away.
		BackoffInitial: 50 * time.Millisecond,
		BackoffMax:     time.Second,
	})
	if err != nil {
		t.Fatalf("plugintest: %v", err)
	}
	for _, typ := range types {
		mgr.m.AddHandler(typ, recorder{mgr})
	}
	mgr.sub = mgr.m.Subscribe()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.m.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("plugintest: manager: %v", err)
		}
	})
	select {
	case <-mgr.m.Synced():
	case err := <-done:
		t.Fatalf("plugintest: manager stopped at start: %v", err)
	}
	return mgr
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
