package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// tempRoot points os.TempDir, where the demo makes its registry directory, at
// a fresh short directory, so the test can check nothing is left in it.
func tempRoot(t *testing.T) string {
	t.Helper()
	root, err := os.MkdirTemp("", "dt")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	t.Setenv("TMPDIR", root)
	return root
}

// assertEmpty fails if the demo left anything in root.
func assertEmpty(t *testing.T, root string) {
	t.Helper()
	left, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range left {
		t.Errorf("demo left %s behind in %s", e.Name(), root)
	}
}

func TestRun(t *testing.T) {
	root := tempRoot(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	if err := run(ctx, &out); err != nil {
		t.Fatalf("run: %v\noutput:\n%s", err, &out)
	}
	assertEmpty(t, root)

	lines := strings.Split(out.String(), "\n")
	// find returns the index of the first line at or after from that
	// contains every one of parts, failing the test if there is none.
	find := func(from int, parts ...string) int {
		t.Helper()
		for i := from; i < len(lines); i++ {
			if containsAll(lines[i], parts...) {
				return i
			}
		}
		t.Errorf("no line after line %d contains all of %q", from+1, parts)
		return len(lines)
	}
	for _, sock := range []string{"csi.sock", "gpu.sock", "greeter.sock"} {
		find(0, "Registered", sock)
	}
	find(0, "Rejected", "csi-old.sock", "validate:", "needs a 1.x version")
	find(0, "Rejected", "unknown.sock", "no_handler:", `"example.com/Unknown"`)
	find(find(0, "Deregistered", "greeter.sock"), "Removed", "greeter.sock")
	failed := find(0, "Failed", "fpga.sock", "connection refused", "retry in")
	find(failed, "Registered", "fpga.sock")

	// The final table.
	table := find(0, "SOCKET", "TYPE", "NAME", "STATE", "ATTEMPTS", "ERROR")
	find(table, "csi-old.sock", "Rejected")
	find(table, "fpga.sock", "Registered")
	find(table, "5 sockets: 3 registered, 2 rejected.")
	find(table, "example.com/Greeter []") // its handler let it go
	if t.Failed() {
		t.Logf("output:\n%s", &out)
	}
}

// Ctrl-C during the scenario stops it cleanly, and leaves nothing behind.
func TestRunInterrupted(t *testing.T) {
	root := tempRoot(t)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	var out bytes.Buffer
	if err := run(ctx, &out); !errors.Is(err, context.Canceled) {
		t.Fatalf("run with a cancelled context returned %v, want context.Canceled\noutput:\n%s", err, &out)
	}
	assertEmpty(t, root)
}

func containsAll(s string, parts ...string) bool {
	for _, p := range parts {
		if !strings.Contains(s, p) {
			return false
		}
	}
	return true
}
