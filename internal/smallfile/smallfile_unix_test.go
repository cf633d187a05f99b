//go:build unix

package smallfile

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Read refuses at once what is not a regular file or is larger than the
// bound: /dev/zero, a FIFO nobody writes to, a directory, a socket, a file
// one byte too large; it reads a file of exactly the bound.
func TestRead(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	const max = 64 << 10
	fits, tooBig := filepath.Join(dir, "fits"), filepath.Join(dir, "too-big")
	if err := os.WriteFile(fits, make([]byte, max), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tooBig, make([]byte, max+1), 0o600); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{
		"/dev/zero": "/dev/zero is a device, not a regular file",
		fifo:        fifo + " is a named pipe (FIFO), not a regular file",
		dir:         "is a directory, not a regular file",
		tooBig:      "too-big is larger than 64 KiB",
	} {
		done := make(chan error, 1)
		go func() { _, err := Read(path, max); done <- err }()
		select {
		case err := <-done:
			var se *Error
			if !errors.As(err, &se) || !strings.Contains(err.Error(), want) {
				t.Errorf("Read(%s): %v, want an *Error that says %q", path, err, want)
			}
		case <-time.After(10 * time.Second):
			os.WriteFile(fifo, nil, 0) // let the read end, so that the goroutine does
			t.Fatalf("Read(%s) did not return", path)
		}
	}
	if b, err := Read(fits, max); err != nil || len(b) != max {
		t.Errorf("Read of a file of exactly the bound: %d bytes, %v", len(b), err)
	}
	if _, err := Read(filepath.Join(dir, "missing"), max); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Read of a missing file: %v, want ErrNotExist", err)
	}
}

func TestSize(t *testing.T) {
	for n, want := range map[int]string{1 << 20: "1 MiB", 4 << 20: "4 MiB", 64 << 10: "64 KiB", 1500: "1500 bytes"} {
		if got := Size(n); got != want {
			t.Errorf("Size(%d) = %q, want %q", n, got, want)
		}
	}
}
