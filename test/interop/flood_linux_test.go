package interop_test

import (
	"errors"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/plugd/plugd/internal/unaryconn"
	"github.com/plugd/plugd/test/interop"
)

// cpu is this process's CPU time so far, all threads.
func cpu(t *testing.T) time.Duration {
	t.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestFlood: a plugin's server flooding its idle connection (issue 13) costs
// the watching process a bounded amount of CPU: the watch closes the
// connection with ErrFlood once the peer has sent more than an idle
// connection needs. For comparison, the same flood read by a loop that keeps
// up with it (as pluginmanager's epoll set did, before Watch) for a
// second. The flooding server is another
// process, so the CPU measured here is only the reading side's.
func TestFlood(t *testing.T) {
	for _, scenario := range []string{interop.FloodWindow, interop.FloodReset, interop.FloodUnknown, interop.FloodSettings} {
		t.Run(scenario, func(t *testing.T) {
			opts := plugin
			opts.Scenario = scenario
			srv := interop.Start(t, interop.Raw, opts)

			c := dial(t, srv)
			if _, err := info(c); err != nil { // the flood begins after the first answer
				t.Fatal(err)
			}
			before := cpu(t)
			hung := watch(t, c)
			err := recv(t, hung, "the flood's end")
			watched := cpu(t) - before
			if !errors.Is(err, unaryconn.ErrFlood) {
				t.Fatalf("hang-up %v, not ErrFlood", err)
			}
			srv.WaitFor(t, "flood-end", 1)
			// A bound on CPU time, not on wall time: a loaded machine
			// does not make the watch read more.
			if watched > 250*time.Millisecond {
				t.Errorf("the watch spent %v of CPU before it closed the connection", watched)
			}

			unbounded := keepUp(t, srv, time.Second)
			t.Logf("%s: the watch closed the connection after %v of CPU (%d frames written by then); reading it without a bound costs %.0f%% of a core",
				scenario, watched.Round(10*time.Microsecond), srv.Of("flood-end")[0].Frames, 100*unbounded.Seconds())
		})
	}
}

// keepUp reads a flooding server's second connection for d, as fast as it
// comes and without a bound (what the manager's reader did before Watch),
// and returns the CPU that cost per second. It only reads and discards:
// answering the PINGs and SETTINGS, as a reader must, would cost more.
func keepUp(t *testing.T, srv *interop.Server, d time.Duration) time.Duration {
	t.Helper()
	c := dial(t, srv)
	if _, err := info(c); err != nil {
		t.Fatal(err)
	}
	raw, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64<<10)
	before, start := cpu(t), time.Now()
	for time.Since(start) < d {
		ended := false
		raw.Control(func(fd uintptr) {
			if p, _ := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 100); p > 0 {
				n, err := unix.Read(int(fd), buf)
				ended = n == 0 || err != nil && !errors.Is(err, unix.EAGAIN)
			}
		})
		if ended {
			t.Log("the unbounded reader's connection ended")
			break
		}
	}
	return time.Duration(float64(cpu(t)-before) / time.Since(start).Seconds())
}
