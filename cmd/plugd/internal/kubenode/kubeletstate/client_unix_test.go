//go:build unix

package kubeletstate

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/rest"
)

// Issue 33, item 8: kubernetes.kubelet.caFile is read by the kubeconfig's
// rule. Before, /dev/zero was read until memory ran out and a FIFO held
// plugd's start until someone wrote to it.
func TestKubeletCAFileBounded(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ path, want string }{
		{"/dev/zero", "kubernetes.kubelet.caFile: /dev/zero is a device, not a regular file: it is read whole; give the path of a PEM file"},
		{fifo, "kubernetes.kubelet.caFile: " + fifo + " is a named pipe (FIFO), not a regular file"},
	} {
		done := make(chan error, 1)
		go func() {
			_, err := NewClient(Config{Address: "127.0.0.1:10250", CAFile: tc.path}, &rest.Config{}, "node-a", "/r")
			done <- err
		}()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%s: %v; want an error that says %q", tc.path, err, tc.want)
			}
		case <-time.After(10 * time.Second):
			os.WriteFile(fifo, nil, 0) // let the read end, so that the goroutine does
			t.Fatalf("%s: NewClient did not return", tc.path)
		}
	}
}
