package testenv

import (
	"bytes"
	"os"
	"sync"
	"testing"
)

// ShortDir returns a new directory, named after prefix, under os.TempDir, and
// removes it when the test ends. A unix socket path must stay under 108
// bytes, which t.TempDir's long paths do not guarantee.
func ShortDir(t testing.TB, prefix string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// Buffer is a bytes.Buffer that one goroutine can write, as a log or a
// process's output, while the test reads it. The zero value is ready to use.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p to the buffer.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String returns everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
