//go:build unix

package daemon

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/plugd/plugd/api"
	"github.com/plugd/plugd/internal/testenv"
)

// Issue 13, item 10: --config reads regular files only, of a bounded size,
// and never blocks: /dev/zero, a FIFO nobody writes to, a directory and a
// huge file are refused at once, on SIGHUP too.
func TestConfigFileMustBeARegularFile(t *testing.T) {
	dir := testenv.ShortDir(t, "pd")
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	huge := filepath.Join(dir, "huge.yaml")
	if err := os.WriteFile(huge, []byte("# "+strings.Repeat("x", 2<<20)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	load := func(path string) error {
		done := make(chan error, 1)
		go func() { _, err := LoadConfig(path); done <- err }()
		select {
		case err := <-done:
			return err
		case <-time.After(wait):
			os.WriteFile(fifo, nil, 0) // let the read end, so that the goroutine does
			t.Fatalf("LoadConfig(%s) did not return", path)
			return nil
		}
	}
	for path, want := range map[string]string{
		"/dev/zero": "config /dev/zero is a device, not a regular file",
		fifo:        "is a named pipe (FIFO), not a regular file",
		dir:         "is a directory, not a regular file",
		huge:        "is larger than 1 MiB",
	} {
		if err := load(path); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("LoadConfig(%s): %v, want it to say %q", path, err, want)
		}
	}

	// A reload from a file replaced by a FIFO is refused, and plugd goes on.
	r := runDaemon(t, Config{})
	reloaded := make(chan struct{})
	go func() {
		defer close(reloaded)
		r.d.reloadFrom(func() (Config, error) { return LoadConfig(fifo) })
	}()
	select {
	case <-reloaded:
	case <-time.After(wait):
		os.WriteFile(fifo, nil, 0)
		t.Fatal("a reload from a FIFO did not return")
	}
	if !strings.Contains(r.logs.String(), "reload refused") || !strings.Contains(r.logs.String(), "named pipe") {
		t.Errorf("the reload is not logged as refused:\n%s", r.logs)
	}
	if _, err := r.client.Plugins(context.Background(), api.Filter{}); err != nil {
		t.Errorf("after the refused reload: %v", err)
	}
}

// Issue 25, item 3: kubernetes.kubeconfig is read as --config is: a FIFO
// or a file over 4 MiB is refused at once, saying what it is; before, the
// FIFO blocked plugd's start and /dev/zero took 3.1 GB in 4 s.
func TestKubeconfigMustBeARegularFile(t *testing.T) {
	dir := testenv.ShortDir(t, "pd")
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
		fifo: "kubernetes.kubeconfig " + fifo + ": " + fifo + " is a named pipe (FIFO), not a regular file: it is read whole",
		huge: huge + " is larger than 4 MiB, more than a kubeconfig file holds",
	} {
		done := make(chan error, 1)
		go func() {
			d, err := New(Config{RegistryDir: filepath.Join(dir, "reg"), Status: StatusConfig{Socket: "none"},
				Kubernetes: &KubernetesConfig{Kubeconfig: path, NodeName: "node-a"}}, io.Discard)
			if d != nil {
				d.closeHandlers()
			}
			done <- err
		}()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("kubeconfig %s: %v, want it to say %q", path, err, want)
			}
		case <-time.After(wait):
			os.WriteFile(fifo, nil, 0) // let the read end, so that the goroutine does
			t.Fatalf("New with kubeconfig %s did not return", path)
		}
	}
}
