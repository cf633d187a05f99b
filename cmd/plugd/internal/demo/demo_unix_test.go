//go:build unix

package demo

import (
	"context"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Issue 33, item 12: SIGHUP (the demo's terminal closed) stops the demo as
// Ctrl-C does: cleanly, nothing left behind. The signal is sent to this
// process, which also listens for it, so that without the demo's handling
// the test fails on its deadline instead of dying.
func TestSIGHUPStopsCleanly(t *testing.T) {
	root := tempRoot(t)
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	defer cancel()
	var once sync.Once
	out := &syncBuffer{onWrite: func(s string) {
		if strings.Contains(s, "Rejected") {
			once.Do(func() { syscall.Kill(os.Getpid(), syscall.SIGHUP) })
		}
	}}
	cmd := Command()
	cmd.SetArgs(nil)
	cmd.SetOut(out)
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(ctx) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("plugd demo, on SIGHUP: %v\noutput:\n%s", err, out)
		}
	case <-time.After(testTimeout / 2):
		cancel()
		<-done
		t.Fatalf("plugd demo did not stop on SIGHUP\noutput:\n%s", out)
	}
	if !strings.Contains(out.String(), "Interrupted: stopping the example plugins, then plugd.") {
		t.Errorf("output:\n%s", out)
	}
	assertNoLeftovers(t, root, out.String())
}
