package hook_test

// What a hook leaves running, watched with Linux's pidfds.

import (
	"errors"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/plugd/plugd/internal/testenv"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/plugd/plugd/handlers/hook"
	"github.com/plugd/plugd/plugin"
	"github.com/plugd/plugd/pluginmanager"
)

func TestCommandTimeoutKillsProcessGroup(t *testing.T) {
	dir := t.TempDir()
	reg := prometheus.NewRegistry()
	// The first run leaves a child in the background, then hangs; later runs accept.
	hk := newHook(t, hook.Config{
		Command: sh(`if [ ! -e "$1/child" ]; then
	sleep 1000 &
	echo $! > "$1/child"
	echo "waiting for the device" >&2
	sleep 1000
fi`, dir),
		Timeout: 2 * time.Second, // a failure bound for a shell's start on a loaded machine; the hook hangs it out
	}, hook.Options{Registerer: reg})
	h := start(t, hk)
	p := testenv.StartPlugin(t, plugin.Config{Dir: h.dir, Type: typ, Name: "slow"})

	ev := h.WaitEvent(p.Path(), pluginmanager.EventFailed)
	if want := "register hook did not finish within 2s; it was killed: waiting for the device"; ev.Error != want {
		t.Errorf("failed with %q, want %q", ev.Error, want)
	}
	waitExited(t, readPid(t, filepath.Join(dir, "child")))

	h.WaitSocket(p.Path(), pluginmanager.StateRegistered)
	checkRuns(t, reg, "register", map[string]float64{"accepted": 1, "timeout": 1})
	if run := hk.Details(ev.Plugin).(hook.Run); run.Result != "accepted" {
		t.Errorf("Details = %+v, want the last run, which accepted", run)
	}
}

func TestCommandLeavesNothingBehind(t *testing.T) {
	t.Run("in its group", func(t *testing.T) {
		dir := t.TempDir()
		hk := newHook(t, hook.Config{Command: sh(`sleep 1000 & echo $! > "$1/child"`, dir)}, hook.Options{})
		if err := hk.Register(t.Context(), testPlugin("bg")); err != nil {
			t.Fatalf("Register: %v", err)
		}
		waitExited(t, readPid(t, filepath.Join(dir, "child")))
	})
	t.Run("out of its group", func(t *testing.T) {
		// A process that left the group is out of reach, but holding the
		// hook's output open does not keep the run from returning.
		dir := t.TempDir()
		hk := newHook(t, hook.Config{Command: sh(`mkfifo "$1/ready"
setsid sh -c 'echo $$ > "$1/child"; echo > "$1/ready"; exec sleep 1000' escapee "$1" &
read _ < "$1/ready" # it has left the group`, dir)}, hook.Options{})
		err := hk.Register(t.Context(), testPlugin("daemon"))
		pid := readPid(t, filepath.Join(dir, "child"))
		if kerr := syscall.Kill(pid, 0); kerr != nil {
			t.Errorf("the process that left the group is gone (%v): this test tests nothing", kerr)
		}
		syscall.Kill(pid, syscall.SIGKILL)
		waitExited(t, pid)
		if err != nil {
			t.Fatalf("Register: %v", err)
		}
	})
}

func readPid(t *testing.T, path string) int {
	t.Helper()
	pid, err := strconv.Atoi(strings.TrimSpace(readFile(t, path)))
	if err != nil || pid <= 0 {
		t.Fatalf("%s holds no pid: %v", path, err)
	}
	return pid
}

// waitExited waits until process pid has exited (a zombie counts: it no longer
// runs), watching a pidfd rather than polling.
func waitExited(t *testing.T, pid int) {
	t.Helper()
	fd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return // gone and reaped
	}
	if err != nil {
		t.Fatalf("pidfd_open %d: %v", pid, err)
	}
	defer unix.Close(fd)
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, int(testenv.Timeout.Milliseconds()))
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			t.Fatalf("poll pidfd of %d: %v", pid, err)
		}
		if n == 0 {
			t.Fatalf("process %d is still running %s after its hook was done", pid, testenv.Timeout)
		}
		return
	}
}
