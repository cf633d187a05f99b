package main

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/plugd/plugd/plugintest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestExitWhenRefused(t *testing.T) {
	// The manager has no handler for example.com/Nope.
	m := plugintest.NewManager(t, "example.com/Greeter")
	ctx, cancel := context.WithTimeout(t.Context(), plugintest.DefaultTimeout)
	defer cancel()
	var stderr bytes.Buffer
	code := run(ctx, []string{"-dir", m.Dir, "-type", "example.com/Nope", "-name", "nope", "-exit-when-refused"}, &stderr)
	if code != exitRefused {
		t.Fatalf("exit status %d, want %d; log:\n%s", code, exitRefused, &stderr)
	}
	if _, err := os.Lstat(filepath.Join(m.Dir, "nope.sock")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("socket left behind after exit: %v", err)
	}
}

func TestRefusedByValidation(t *testing.T) {
	m := plugintest.NewManager(t, "example.com/Greeter")
	m.RefuseValidate("greeter.example.com", errors.New("greeters are not welcome here"))
	ctx, cancel := context.WithTimeout(t.Context(), plugintest.DefaultTimeout)
	defer cancel()
	var stderr bytes.Buffer
	if code := run(ctx, []string{"-dir", m.Dir, "-exit-when-refused"}, &stderr); code != exitRefused {
		t.Fatalf("exit status %d, want %d; log:\n%s", code, exitRefused, &stderr)
	}
	// The plugin has exited and removed its socket; what it was told is in its log.
	if !strings.Contains(stderr.String(), "greeters are not welcome here") {
		t.Errorf("the plugin's log does not give the manager's reason:\n%s", &stderr)
	}
	if calls := m.Calls(); len(calls) == 0 || calls[0].Op != "validate" {
		t.Errorf("handler calls = %+v, want a validation first", calls)
	}
}

func TestRegistersAndStopsOnSignal(t *testing.T) {
	m := plugintest.NewManager(t, "example.com/Greeter")
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var stderr syncWriter
	done := make(chan int, 1)
	go func() { done <- run(ctx, []string{"-dir", m.Dir, "-exit-when-refused"}, &stderr) }()

	p := m.WaitRegistered("greeter.example.com")
	if p.Type != "example.com/Greeter" || p.Endpoint != filepath.Join(m.Dir, "greeter.example.com.sock") {
		t.Errorf("registered as %+v", p)
	}

	cancel() // what signal.NotifyContext does on SIGINT
	if code := <-done; code != 0 {
		t.Fatalf("exit status %d after a signal, want 0; log:\n%s", code, stderr.String())
	}
	if _, err := os.Lstat(filepath.Join(m.Dir, "greeter.example.com.sock")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("socket left behind after exit: %v", err)
	}
}

// syncWriter is the plugin's log, written by its goroutine and read at the end.
type syncWriter struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (w *syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *syncWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}
