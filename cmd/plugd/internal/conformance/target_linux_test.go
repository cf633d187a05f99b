package conformance

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/plugd/plugd/cmd/plugd/internal/daemon"
	"github.com/plugd/plugd/internal/testenv"
)

// wrapped is the kit's command line for this binary's test plugin kind,
// started by a shell that first leaves a child of its own running (as a
// wrapper script that starts a helper does), writing the child's pid to
// pids.
func wrapped(t *testing.T, kind, pids string) []string {
	t.Helper()
	script := fmt.Sprintf(`sleep 60 & echo $! >> %q; exec "$0" %s %s`, pids, pluginArg, kind)
	return []string{"/bin/sh", "-c", script, os.Args[0]}
}

// alive says whether the process pid still runs 5 s from now: it waits
// for its exit on a pidfd (a zombie has exited).
func alive(pid int) bool {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return false // gone
	}
	defer unix.Close(fd)
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, 5000)
		if err == unix.EINTR {
			continue
		}
		return err == nil && n == 0
	}
}

// A plugin that leaves processes of its own (a wrapper script's helper)
// neither hangs the kit, whose output to the plugin stays open in them,
// nor outlives the run: the kit stops the plugin's whole process group.
func TestRunStopsThePluginsProcessGroup(t *testing.T) {
	pids := filepath.Join(t.TempDir(), "pids")
	run := newKitRun(t, "csi", "", 10*time.Second)
	run.cfg.Command = wrapped(t, "csi", pids)
	done := make(chan struct{})
	go func() {
		defer close(done)
		run.run()
	}()
	select {
	case <-done:
	case <-time.After(45 * time.Second):
		t.Fatal("the kit did not return within 45 s: it waits for the plugin's helper, which holds its output open")
	}
	run.check(t)
	wantAllPass(t, run.rep, typeCSI)
	b, err := os.ReadFile(pids)
	if err != nil {
		t.Fatal(err)
	}
	fields := strings.Fields(string(b))
	if len(fields) == 0 {
		t.Fatal("the wrapper wrote no pid")
	}
	for _, f := range fields {
		pid, err := strconv.Atoi(f)
		if err != nil {
			t.Fatal(err)
		}
		if alive(pid) {
			t.Errorf("the plugin's helper %d still runs after the kit returned", pid)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// An interrupted run (the kit's context cancelled: Ctrl-C, a CI job
// cancelled) stops the plugin and its process group before it returns,
// and says it was interrupted.
func TestInterruptedRunStopsThePlugin(t *testing.T) {
	pids := filepath.Join(t.TempDir(), "pids")
	run := newKitRun(t, "device", "", 10*time.Second)
	run.cfg.Command = wrapped(t, "device", pids)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		run.rep, run.err = Run(ctx, run.cfg)
	}()
	// Once the plugin's socket is there, the run is under way.
	wctx, wcancel := withDeadline(context.Background(), 10*time.Second, "the plugin's registration socket")
	_, _, err := waitSocket(wctx, run.cfg.RegistryDir, nil, nil, nil)
	wcancel()
	if err != nil {
		cancel()
		<-done
		t.Fatal(err)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("the kit did not return within 20 s of its context's end")
	}
	if run.err == nil || !strings.Contains(run.err.Error(), "interrupted") {
		t.Errorf("Run's error: %v, want one that says the run was interrupted", run.err)
	}
	b, _ := os.ReadFile(pids)
	for _, f := range strings.Fields(string(b)) {
		pid, _ := strconv.Atoi(f)
		if alive(pid) {
			t.Errorf("the plugin's helper %d still runs after the interrupted kit returned", pid)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// plugd conformance stopped by SIGTERM or SIGINT (a CI job cancelled,
// Ctrl-C) stops the plugin it started, with its process group, says so,
// and exits 1. The plugin runs in a process group of its own, which a
// terminal's Ctrl-C no longer reaches: the kit must pass the signal on.
func TestCommandInterruptedStopsThePlugin(t *testing.T) {
	// Held here too, so that a kit that does not catch the signal is not
	// killed with the test binary, but runs on and fails the test.
	held := make(chan os.Signal, 1)
	signal.Notify(held, syscall.SIGTERM)
	defer signal.Stop(held)
	pids := filepath.Join(t.TempDir(), "pids")
	reg := testenv.ShortDir(t, "reg")
	type result struct {
		code   int
		stderr string
	}
	args := append([]string{"conformance", "--registry-dir", reg, "--"}, wrapped(t, "device", pids)...)
	done := make(chan result, 1)
	go func() {
		code, _, stderr := plugd(t, args...)
		done <- result{code, stderr}
	}()
	wctx, cancel := withDeadline(context.Background(), 10*time.Second, "the plugin's registration socket")
	_, _, err := waitSocket(wctx, reg, nil, nil, nil)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	var res result
	select {
	case res = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("plugd conformance did not return within 30 s of SIGTERM")
	}
	if res.code != daemon.ExitError || !strings.Contains(res.stderr, "interrupted") {
		t.Errorf("exit status %d, standard error %q; want %d and an error saying the run was interrupted", res.code, res.stderr, daemon.ExitError)
	}
	b, _ := os.ReadFile(pids)
	for _, f := range strings.Fields(string(b)) {
		pid, _ := strconv.Atoi(f)
		if alive(pid) {
			t.Errorf("the plugin's helper %d still runs after plugd conformance returned", pid)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}
