package testenv

import (
	"bytes"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/utils/clock"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/plugd/plugd/plugin"
)

// Timeout is how long a test waits for what should take milliseconds, in
// plugd's own tests and in plugintest's waits (its DefaultTimeout). It is a
// failure bound, not a pace: a wait returns as soon as what it waits for
// happens. It is generous because -race on a loaded machine is slow.
const Timeout = 20 * time.Second

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
	mu      sync.Mutex
	b       bytes.Buffer
	written chan struct{} // closed at the next Write (Wait's), then made anew
}

// Write appends p to the buffer.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.written != nil {
		close(b.written)
		b.written = nil
	}
	return b.b.Write(p)
}

// Wait waits until what was written contains s, failing the test after
// timeout (a failure bound, not a pace): it wakes at each Write.
func (b *Buffer) Wait(t testing.TB, s string, timeout time.Duration) {
	t.Helper()
	b.WaitN(t, s, 1, timeout)
}

// WaitN waits, as Wait does, until what was written contains s n times.
func (b *Buffer) WaitN(t testing.TB, s string, n int, timeout time.Duration) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		b.mu.Lock()
		if strings.Count(b.b.String(), s) >= n {
			b.mu.Unlock()
			return
		}
		if b.written == nil {
			b.written = make(chan struct{})
		}
		written := b.written
		b.mu.Unlock()
		select {
		case <-written:
		case <-deadline.C:
			t.Fatalf("%q not written %d times within %s; written:\n%s", s, n, timeout, b.String())
		}
	}
}

// String returns everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// StartPlugin serves a plugin with the SDK until the test ends. A cfg
// without Versions gets "v1": the SDK requires some, and most tests do not
// care which.
func StartPlugin(t testing.TB, cfg plugin.Config) *plugin.Server {
	t.Helper()
	if len(cfg.Versions) == 0 {
		cfg.Versions = []string{"v1"}
	}
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

// AcceptCounter serves a unix socket at path that accepts connections,
// counts them and closes them: a third party that plugd must not be led to.
// Connected is closed at the first connection.
type AcceptCounter struct {
	n         atomic.Int64
	Connected chan struct{}

	t        testing.TB
	path     string
	sentinel chan struct{} // a connection of Count's own was accepted
	asked    atomic.Int64  // Count's connections so far
}

// sentinelPrefix names the address Count's own connections are bound to,
// by which the server knows them.
const sentinelPrefix = ".count-"

// Count is how many connections were accepted, counting every connection
// made before Count was called, even one still waiting to be accepted: it
// connects itself, and waits until that connection is accepted; the
// listener accepts in the order connections were made.
func (a *AcceptCounter) Count() int64 {
	a.t.Helper()
	name := filepath.Join(filepath.Dir(a.path), fmt.Sprintf("%s%d.sock", sentinelPrefix, a.asked.Add(1)))
	c, err := net.DialUnix("unix", &net.UnixAddr{Name: name, Net: "unix"}, &net.UnixAddr{Name: a.path, Net: "unix"})
	if err != nil {
		a.t.Fatalf("testenv: counting the connections to %s: %v", a.path, err)
	}
	defer os.Remove(name)
	defer c.Close()
	select {
	case <-a.sentinel:
	case <-time.After(30 * time.Second): // a failure bound on a loaded machine
		a.t.Fatalf("testenv: the counting connection to %s was not accepted", a.path)
	}
	return a.n.Load()
}

// CountAccepts serves an AcceptCounter at path until the test ends.
func CountAccepts(t testing.TB, path string) *AcceptCounter {
	t.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	a := &AcceptCounter{Connected: make(chan struct{}), t: t, path: path, sentinel: make(chan struct{}, 1)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			if strings.HasPrefix(filepath.Base(c.RemoteAddr().String()), sentinelPrefix) {
				a.sentinel <- struct{}{}
			} else if a.n.Add(1) == 1 {
				close(a.Connected)
			}
			c.Close()
		}
	}()
	t.Cleanup(func() { l.Close(); <-done })
	return a
}

// TimerClock is a fake clock that tells when a timer is made on it, so that
// a test can wait for the code under test to start waiting, then step it.
type TimerClock struct {
	*testingclock.FakeClock
	// Timers receives the duration of every timer made, as it is made
	// (the first 1024 not yet received; more are not told).
	Timers chan time.Duration
}

// NewTimerClock is a TimerClock at a fixed time.
func NewTimerClock() *TimerClock {
	return &TimerClock{FakeClock: testingclock.NewFakeClock(time.Unix(1_700_000_000, 0)), Timers: make(chan time.Duration, 1024)}
}

// NewTimer makes a timer of the fake clock, and tells Timers.
func (c *TimerClock) NewTimer(d time.Duration) clock.Timer {
	t := c.FakeClock.NewTimer(d)
	select {
	case c.Timers <- d:
	default:
	}
	return t
}

// StepUntil moves clk on by d, and again by d whenever cond has not come
// to hold within a quarter second of real time, until it holds; it fails
// t after Timeout, saying what it waited for. The code under test arms a
// timer a moment after what a test can wait on shows (a socket's state, a
// log line): a single Step may come before that timer exists, which then
// waits for a Step that never comes. Each further Step is one more d of
// the fake clock: use it where a timer firing late, or twice, is what the
// test allows.
func StepUntil(t testing.TB, clk interface{ Step(time.Duration) }, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(Timeout)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		clk.Step(d)
		for settle := time.Now().Add(250 * time.Millisecond); time.Now().Before(settle); <-tick.C {
			if cond() {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("testenv: %s: not after %s of stepping the clock by %s", what, Timeout, d)
		}
	}
}
