package main

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/plugd/plugd/pluginmanager"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// wait bounds each wait; generous, as -race on a busy machine is slow.
const wait = 20 * time.Second

// startManager runs a manager on a fresh short directory (unix socket paths
// must stay under 108 bytes) with a handler for example.com/Greeter only, and
// stops it when the test ends.
func startManager(t *testing.T) (string, *pluginmanager.Subscription) {
	t.Helper()
	dir, err := os.MkdirTemp("", "pt")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	m, err := pluginmanager.New(pluginmanager.Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	m.AddHandler("example.com/Greeter", pluginmanager.HandlerFuncs{})
	sub := m.Subscribe()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager Run: %v", err)
		}
	})
	return dir, sub
}

func TestExitWhenRefused(t *testing.T) {
	dir, _ := startManager(t)
	ctx, cancel := context.WithTimeout(t.Context(), wait)
	defer cancel()
	var stderr bytes.Buffer
	code := run(ctx, []string{"-dir", dir, "-type", "example.com/Nope", "-name", "nope", "-exit-when-refused"}, &stderr)
	if code != exitRefused {
		t.Fatalf("exit status %d, want %d; log:\n%s", code, exitRefused, &stderr)
	}
	if _, err := os.Lstat(filepath.Join(dir, "nope.sock")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("socket left behind after exit: %v", err)
	}
}

func TestRegistersAndStopsOnSignal(t *testing.T) {
	dir, sub := startManager(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var stderr bytes.Buffer
	done := make(chan int, 1)
	go func() { done <- run(ctx, []string{"-dir", dir, "-exit-when-refused"}, &stderr) }()

	timeout := time.After(wait)
	for registered := false; !registered; {
		select {
		case ev := <-sub.Events():
			registered = ev.Type == pluginmanager.EventRegistered && ev.Plugin.Name == "greeter.example.com"
		case code := <-done:
			t.Fatalf("plugin exited with status %d before it was registered; log:\n%s", code, &stderr)
		case <-timeout:
			cancel()
			<-done
			t.Fatalf("plugin not registered within %s; log:\n%s", wait, &stderr)
		}
	}

	cancel() // what signal.NotifyContext does on SIGINT
	if code := <-done; code != 0 {
		t.Fatalf("exit status %d after a signal, want 0; log:\n%s", code, &stderr)
	}
	if _, err := os.Lstat(filepath.Join(dir, "greeter.example.com.sock")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("socket left behind after exit: %v", err)
	}
}
