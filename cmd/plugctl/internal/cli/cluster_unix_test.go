//go:build unix

package cli

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/plugd/plugd/internal/testenv"
)

// Issue 25, item 3: plugctl cluster reads a kubeconfig only if it is a
// regular file of at most 4 MiB, and says so at once otherwise; before, a
// FIFO blocked it and /dev/zero was read until memory ran out.
func TestClusterKubeconfigIsBounded(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	huge := filepath.Join(dir, "huge")
	if err := os.WriteFile(huge, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(huge, 4<<20+1); err != nil { // sparse: costs no disk
		t.Fatal(err)
	}
	for path, want := range map[string]string{
		fifo: fifo + " is a named pipe (FIFO), not a regular file",
		huge: huge + " is larger than 4 MiB",
	} {
		done := make(chan result, 1)
		go func() { done <- run("cluster", "--kubeconfig", path) }()
		select {
		case r := <-done:
			r.want(t, ExitError, "cannot find the Kubernetes API server", want)
		case <-time.After(testenv.Timeout):
			os.WriteFile(fifo, nil, 0) // let the read end, so that the goroutine does
			t.Fatalf("plugctl cluster --kubeconfig %s did not return", path)
		}
	}
}
