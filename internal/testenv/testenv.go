package testenv

import (
	"bytes"
	"log/slog"
	"net"
	"os"
	"sync"
	"testing"

	"github.com/plugd/plugd/plugin"
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

// StartPlugin serves a plugin with the SDK until the test ends.
func StartPlugin(t testing.TB, cfg plugin.Config) *plugin.Server {
	t.Helper()
	s, err := plugin.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// DeadSocket leaves a socket file at path that nobody listens on, as a
// plugin that crashed does.
func DeadSocket(t testing.TB, path string) {
	t.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
}

// WarnLogger returns a logger that writes its warnings and errors, as text,
// to the Buffer it returns, for a test that checks a component warns of
// nothing (or of exactly what it should).
func WarnLogger() (*slog.Logger, *Buffer) {
	b := new(Buffer)
	return slog.New(slog.NewTextHandler(b, &slog.HandlerOptions{Level: slog.LevelWarn})), b
}
