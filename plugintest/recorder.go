package plugintest

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/plugd/plugd/pluginmanager"
)

// Call is one call of a Recorder.
type Call struct {
	Op     string // "validate", "register" or "deregister"
	Plugin pluginmanager.Plugin
}

// Recorder is a pluginmanager.Handler that records every call and accepts
// every plugin, unless told to refuse one (RefuseValidate) or to fail its
// registration (FailRegister). It may serve several plugin types, and is
// safe for concurrent use. Make one with NewRecorder.
type Recorder struct {
	mu      sync.Mutex
	calls   []Call
	refuse  map[string]error                // by plugin name: Validate's answer
	failReg map[string]error                // by plugin name: Register's answer
	held    map[string]pluginmanager.Plugin // by socket: registered and not deregistered since
	change  chan struct{}                   // closed and replaced at every call
}

// NewRecorder returns a Recorder that has seen no call.
func NewRecorder() *Recorder {
	return &Recorder{refuse: map[string]error{}, failReg: map[string]error{}, held: map[string]pluginmanager.Plugin{}, change: make(chan struct{})}
}

// Calls returns the calls so far, in order.
func (r *Recorder) Calls() []Call {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.calls)
}

// Count returns how many calls of op (validate, register, deregister) the
// plugin called name has had.
func (r *Recorder) Count(op, name string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, c := range r.calls {
		if c.Op == op && c.Plugin.Name == name {
			n++
		}
	}
	return n
}

// Holds returns what the Recorder holds for the socket at path: the plugin
// registered from it, unless deregistered since.
func (r *Recorder) Holds(path string) (pluginmanager.Plugin, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p, ok := r.held[path]
	return p, ok
}

// RefuseValidate makes Validate refuse the plugin called name with err, as a
// handler does when the plugin breaks its rules: the plugin is Rejected and
// told err. A nil err accepts it again (for its next socket).
func (r *Recorder) RefuseValidate(name string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.refuse[name] = err
}

// FailRegister makes Register fail for the plugin called name with err: the
// plugin is told err and retried after a short backoff (or Rejected, for a
// pluginmanager.TerminalError), until FailRegister(name, nil).
func (r *Recorder) FailRegister(name string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failReg[name] = err
}

// WaitCalls waits until the Recorder has seen n calls of op (validate,
// register or deregister) for the plugin called name, and fails the test,
// with the calls so far, if that does not happen within DefaultTimeout.
func (r *Recorder) WaitCalls(t testing.TB, op, name string, n int) {
	t.Helper()
	r.waitCalls(t, op, name, n, DefaultTimeout)
}

func (r *Recorder) waitCalls(t testing.TB, op, name string, n int, timeout time.Duration) {
	t.Helper()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		changed := r.changed()
		if r.Count(op, name) >= n {
			return
		}
		select {
		case <-changed:
		case <-timer.C:
			t.Fatalf("plugintest: %d× %s %s not seen within %s; calls: %v", n, op, name, timeout, r.Calls())
		}
	}
}

// changed returns a channel closed at the next call.
func (r *Recorder) changed() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.change
}

func (r *Recorder) recordLocked(op string, p pluginmanager.Plugin) {
	p.Versions = slices.Clone(p.Versions)
	r.calls = append(r.calls, Call{Op: op, Plugin: p})
	close(r.change)
	r.change = make(chan struct{})
}

// Validate records the call, and refuses the plugin if RefuseValidate said so.
func (r *Recorder) Validate(_ context.Context, p pluginmanager.Plugin) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recordLocked("validate", p)
	return r.refuse[p.Name]
}

// Register records the call, and fails if FailRegister said so.
func (r *Recorder) Register(_ context.Context, p pluginmanager.Plugin) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recordLocked("register", p)
	if err := r.failReg[p.Name]; err != nil {
		return err
	}
	r.held[p.Socket] = p
	return nil
}

// Deregister records the call.
func (r *Recorder) Deregister(_ context.Context, p pluginmanager.Plugin) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recordLocked("deregister", p)
	delete(r.held, p.Socket)
}
