// Package plugintest runs a plugin manager in-process for tests, as
// net/http/httptest runs a server: point your plugin at Manager.Dir, then
// wait for it to register and look at what it sent.
//
//	m := plugintest.NewManager(t, "example.com/Greeter")
//	srv, _ := plugin.Start(plugin.Config{Dir: m.Dir, Type: "example.com/Greeter", Name: "greeter", Versions: []string{"v1"}})
//	p := m.WaitRegistered("greeter")  // what the plugin said in GetInfo
//
// The manager is the real one (package pluginmanager) speaking the kubelet's
// registration protocol over a real unix socket. NewManager gives it a
// Recorder for each type, a handler that records every call and accepts
// every plugin unless told to refuse one. The authors of a handler run the
// same manager with their own handlers (a Recorder among them, if they
// like) through NewManagerWith, and check them with TestHandler, a
// conformance suite every handler should pass.
//
// Waiting is on the manager's events, never on sleeps: Until re-checks a
// condition on the manager's snapshot at every event, and WaitState,
// WaitSocket, WaitGone and WaitEvent are made of it. With a fake clock in
// the Options (k8s.io/utils/clock/testing), retries, probes and grace
// periods fall due only when the test advances it, exactly.
package plugintest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/plugd/plugd/internal/testenv"
	"github.com/plugd/plugd/pluginmanager"
)

// DefaultTimeout, 20 seconds, bounds each Wait of a Manager unless
// Manager.Timeout is set. It is a failure bound, not a pace: a wait returns
// as soon as what it waits for happens. plugd's own tests wait as long.
const DefaultTimeout = testenv.Timeout

// shutdownWait bounds the wait for the manager to stop at the end of a test.
const shutdownWait = time.Minute

// Manager is a running plugin manager on a temporary registry directory. It
// stops, and the directory is removed, when the test ends. Its Wait methods
// and Until share one event stream: call them from the test's goroutine,
// one at a time; the other methods are safe from any goroutine.
type Manager struct {
	// Dir is the registry directory: the plugin under test puts its
	// registration socket here.
	Dir string
	// Timeout bounds each Wait method; zero means DefaultTimeout.
	Timeout time.Duration

	t   testing.TB
	m   *pluginmanager.Manager
	sub *pluginmanager.Subscription
	rec *Recorder // the first Recorder among the handlers, by type; nil if none

	stop func() // Stop

	seen []pluginmanager.Event // events read from sub so far
	next int                   // seen[next:] came after the last wait returned
}

// NewManager starts a manager that accepts plugins of the given types (at
// least one) with a Recorder.
func NewManager(t testing.TB, types ...string) *Manager {
	t.Helper()
	if len(types) == 0 {
		t.Fatal("plugintest.NewManager: name the plugin types to accept, such as \"CSIPlugin\" or your own type")
	}
	rec := NewRecorder()
	handlers := make(map[string]pluginmanager.Handler, len(types))
	for _, typ := range types {
		handlers[typ] = rec
	}
	return NewManagerWith(t, pluginmanager.Options{}, handlers)
}

// NewManagerWith starts the real manager with opts and handlers (by plugin
// type), for the authors of a handler to test it against real plugins. It
// stops when the test ends, as NewManager's does, and fails the test if its
// Run returned an error. A handler that is also a pluginmanager.Observer is
// added as the type's observer too, for a manager observing
// (opts.Observe). More handlers, and handlers with HandlerOptions, can be
// added with Manager().AddHandler.
//
// A zero opts.Dir means a fresh, short temporary registry directory, removed
// when the test ends (a unix socket path must be shorter than 108 bytes, and
// t.TempDir's can be longer). A zero BackoffInitial or BackoffMax is
// shortened (to 20ms and 200ms), so that a test sees a retry soon; every
// other zero field keeps the manager's default.
//
// Calls, RefuseValidate, FailRegister and WaitCalls work on the first
// *Recorder among handlers (by type); with none, they fail the test.
func NewManagerWith(t testing.TB, opts pluginmanager.Options, handlers map[string]pluginmanager.Handler) *Manager {
	t.Helper()
	mgr := &Manager{t: t}
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
		opts.BackoffInitial = 20 * time.Millisecond
	}
	if opts.BackoffMax == 0 {
		opts.BackoffMax = max(200*time.Millisecond, opts.BackoffInitial)
	}
	var err error
	mgr.m, err = pluginmanager.New(opts)
	if err != nil {
		t.Fatalf("plugintest: %v", err)
	}
	for _, typ := range slices.Sorted(maps.Keys(handlers)) {
		h := handlers[typ]
		mgr.m.AddHandler(typ, h)
		if obs, ok := h.(pluginmanager.Observer); ok {
			mgr.m.AddObserver(typ, obs)
		}
		if r, ok := h.(*Recorder); ok && mgr.rec == nil {
			mgr.rec = r
		}
	}
	mgr.sub = mgr.m.Subscribe()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.m.Run(ctx) }()
	var once sync.Once
	mgr.stop = func() {
		once.Do(func() {
			cancel()
			// Bounded: a handler that ignores its context is the test's
			// failure, not a hang until go test's own timeout.
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("plugintest: manager: %v", err)
				}
			case <-time.After(shutdownWait):
				t.Errorf("plugintest: the manager did not stop within %s", shutdownWait)
			}
			mgr.sub.Close()
		})
	}
	t.Cleanup(mgr.stop)
	select {
	case <-mgr.m.Synced():
	case err := <-done:
		t.Fatalf("plugintest: manager stopped at start: %v", err)
	}
	return mgr
}

// Stop stops the manager, and returns once its Run has returned, as at the
// end of the test (it fails the test if Run returned an error). It may be
// called more than once; the Wait methods fail after it.
func (m *Manager) Stop() {
	m.t.Helper()
	m.stop()
}

// Manager returns the underlying manager, for its snapshot and events.
func (m *Manager) Manager() *pluginmanager.Manager { return m.m }

// Recorder returns the manager's Recorder, failing the test if it has none.
func (m *Manager) Recorder() *Recorder {
	m.t.Helper()
	if m.rec == nil {
		m.t.Fatal("plugintest: this manager has no Recorder: give one (plugintest.NewRecorder()) among NewManagerWith's handlers")
	}
	return m.rec
}

// Calls returns the Recorder's calls so far, in order.
func (m *Manager) Calls() []Call {
	m.t.Helper()
	return m.Recorder().Calls()
}

// RefuseValidate makes the Recorder refuse the plugin called name with err
// (see Recorder.RefuseValidate).
func (m *Manager) RefuseValidate(name string, err error) {
	m.t.Helper()
	m.Recorder().RefuseValidate(name, err)
}

// FailRegister makes the Recorder's Register fail for the plugin called
// name with err (see Recorder.FailRegister).
func (m *Manager) FailRegister(name string, err error) {
	m.t.Helper()
	m.Recorder().FailRegister(name, err)
}

// WaitCalls waits until the Recorder has seen n calls of op (validate,
// register or deregister) for the plugin called name, and fails the test,
// with the calls so far, if that does not happen within the Manager's
// timeout.
func (m *Manager) WaitCalls(op, name string, n int) {
	m.t.Helper()
	m.Recorder().waitCalls(m.t, op, name, n, m.timeout())
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

// Find returns the status of the socket at path in ps, a snapshot of
// Manager.Plugins, as a condition of Until looks for it.
func Find(ps []pluginmanager.PluginStatus, path string) (pluginmanager.PluginStatus, bool) {
	for _, s := range ps {
		if s.Socket == path {
			return s, true
		}
	}
	return pluginmanager.PluginStatus{}, false
}

// Until waits until cond holds on the manager's snapshot, re-checking at
// every event, and returns that snapshot; it fails the test, saying what
// it waited for and with the last snapshot, if that does not happen in
// time.
func (m *Manager) Until(what string, cond func([]pluginmanager.PluginStatus) bool) []pluginmanager.PluginStatus {
	m.t.Helper()
	snap, err := m.until(cond)
	if err != nil {
		m.t.Fatalf("plugintest: %s: %v after %s; plugins: %s", what, err, m.timeout(), Summary(snap))
	}
	m.pass()
	return snap
}

// WaitRegistered waits until the plugin called name is registered and returns
// what it sent; it fails the test if that does not happen in time.
func (m *Manager) WaitRegistered(name string) pluginmanager.Plugin {
	m.t.Helper()
	return m.WaitState(name, pluginmanager.StateRegistered).Plugin
}

// WaitState waits until the plugin called name is in state and returns its
// status; it fails the test, with the plugin's last status, if that does not
// happen in time. The event of the change may come after it returns (see
// WaitSocket).
func (m *Manager) WaitState(name string, state pluginmanager.State) pluginmanager.PluginStatus {
	m.t.Helper()
	var got pluginmanager.PluginStatus
	_, err := m.until(func([]pluginmanager.PluginStatus) bool {
		s, ok := m.Status(name)
		got = s
		return ok && s.State == state
	})
	if err != nil {
		m.t.Fatalf("plugintest: plugin %q is not %s: %v after %s; last status: %+v", name, state, err, m.timeout(), got)
	}
	m.pass()
	return got
}

// WaitSocket waits until the plugin whose registration socket is at path is
// in state and returns its status, as WaitState does for a plugin by name; it
// fails the test, with the socket's last status, if that does not happen in
// time. Use it when several sockets carry one plugin name, or when the test
// knows the socket rather than the name.
//
// It looks at the manager's state (Plugins), which the event of a change
// follows a moment later: the event that reported the state waited for may
// come after WaitSocket returns, and a WaitEvent for that type would then
// return it. To wait for a change and then for the next of its kind, wait
// for the first change's event too (WaitEvent, WaitLook).
func (m *Manager) WaitSocket(path string, state pluginmanager.State) pluginmanager.PluginStatus {
	m.t.Helper()
	var got pluginmanager.PluginStatus
	_, err := m.until(func(ps []pluginmanager.PluginStatus) bool {
		var ok bool
		got, ok = Find(ps, path)
		return ok && got.State == state
	})
	if err != nil {
		m.t.Fatalf("plugintest: the socket %s is not %s: %v after %s; last status: %+v", path, state, err, m.timeout(), got)
	}
	m.pass()
	return got
}

// WaitGone waits until the manager has forgotten the socket at path.
func (m *Manager) WaitGone(path string) {
	m.t.Helper()
	var got pluginmanager.PluginStatus
	_, err := m.until(func(ps []pluginmanager.PluginStatus) bool {
		var ok bool
		got, ok = Find(ps, path)
		return !ok
	})
	if err != nil {
		m.t.Fatalf("plugintest: the manager still knows %s: %v after %s; its status: %+v", path, err, m.timeout(), got)
	}
	m.pass()
}

// WaitEvent waits for the next event about the socket at path of type typ
// (or of any of the types more names), and returns it. It looks at the
// events in order, from the first that came after the last wait (of any
// kind) returned: an event that came before is not found. An observing manager
// publishes one event per look (Looked, Answering or NotAnswering), so a
// test waits for a look with all three.
func (m *Manager) WaitEvent(path string, typ pluginmanager.EventType, more ...pluginmanager.EventType) pluginmanager.Event {
	m.t.Helper()
	types := append([]pluginmanager.EventType{typ}, more...)
	var found pluginmanager.Event
	lost := 0
	_, err := m.until(func([]pluginmanager.PluginStatus) bool {
		for i := m.next; i < len(m.seen); i++ {
			if ev := m.seen[i]; ev.Type == pluginmanager.EventLost {
				lost = ev.Missed
				return true
			} else if ev.Plugin.Socket == path && slices.Contains(types, ev.Type) {
				found, m.next = ev, i+1
				return true
			}
		}
		return false
	})
	if err != nil {
		m.t.Fatalf("plugintest: no %v event for %s: %v after %s", types, filepath.Base(path), err, m.timeout())
	}
	if lost > 0 {
		m.t.Fatalf("plugintest: waiting for %v of %s, the manager dropped %d events: the test fell behind its Options.EventBuffer", types, filepath.Base(path), lost)
	}
	m.seen, m.next = m.seen[m.next:], 0
	return found
}

// WaitLook waits for the next look of an observing manager at the socket at
// path (its next Looked, Answering or NotAnswering event), and returns it.
func (m *Manager) WaitLook(path string) pluginmanager.Event {
	m.t.Helper()
	return m.WaitEvent(path, pluginmanager.EventLooked, pluginmanager.EventAnswering, pluginmanager.EventNotAnswering)
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
	m.WaitGone(s.Socket)
}

// until re-checks cond on every event until it holds or the timeout passes,
// and returns the last snapshot it was checked on.
func (m *Manager) until(cond func([]pluginmanager.PluginStatus) bool) ([]pluginmanager.PluginStatus, error) {
	timer := time.NewTimer(m.timeout())
	defer timer.Stop()
	for {
		m.drain()
		snap := m.m.Plugins()
		if cond(snap) {
			return snap, nil
		}
		select {
		case ev, ok := <-m.sub.Events():
			if !ok {
				return snap, errors.New("the manager stopped")
			}
			m.seen = append(m.seen, ev)
		case <-timer.C:
			return snap, fmt.Errorf("timed out")
		}
	}
}

// pass marks the events seen so far as passed: a WaitEvent after a wait
// looks only at the events that came after it.
func (m *Manager) pass() {
	m.seen, m.next = m.seen[:0], 0
}

// drain takes the events already delivered.
func (m *Manager) drain() {
	for {
		select {
		case ev, ok := <-m.sub.Events():
			if !ok {
				return
			}
			m.seen = append(m.seen, ev)
		default:
			return
		}
	}
}

func (m *Manager) timeout() time.Duration {
	if m.Timeout > 0 {
		return m.Timeout
	}
	return DefaultTimeout
}

// Summary shows a snapshot briefly, for a test's failure message: how many
// sockets, and for the first 20 of them the name, state, reason and error.
func Summary(ps []pluginmanager.PluginStatus) string {
	const most = 20
	var b strings.Builder
	fmt.Fprintf(&b, "%d sockets", len(ps))
	for i, p := range ps {
		if i == most {
			fmt.Fprintf(&b, "; and %d more", len(ps)-most)
			break
		}
		fmt.Fprintf(&b, "; %s %s", filepath.Base(p.Socket), p.State)
		if p.Type != "" {
			fmt.Fprintf(&b, " (%s %s)", p.Type, p.Name)
		}
		if p.Reason != "" {
			fmt.Fprintf(&b, " %s: %.200s", p.Reason, p.LastError)
		}
	}
	return b.String()
}

// MaxProbeDelay is the longest time after a probe (or an observing
// manager's look, or a registration) started that the next probe of a
// plugin probed every interval is due: the interval, 10% of jitter, and the
// step of the grid probes are put off to. A test on a fake clock advances it
// by this much, once what it waited for was seen, to see exactly one more
// probe: the one after is due at least 90% of an interval after that one
// starts.
func MaxProbeDelay(interval time.Duration) time.Duration {
	return interval + interval/10 + min(interval/10, time.Second)
}
