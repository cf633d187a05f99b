package faults

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/plugd/plugd/internal/testenv"
	"github.com/plugd/plugd/pluginmanager"
)

// A plugin killed with SIGKILL leaves its socket behind: it is Unhealthy at
// once (the manager's idle connection to it is hung up, long before the next
// probe, an hour away here), still registered; deregistered once its grace
// period is over; and registered again at once when it restarts (not at the
// next retry of the old socket, an hour away here too).
func TestKilledPlugin(t *testing.T) {
	dir := testenv.ShortDir(t, "f")
	checkLeaks(t, dir)
	rec := newRecorder()
	const probe, grace, backoff = time.Hour, 500 * time.Millisecond, time.Hour
	m := runManager(t, pluginmanager.Options{Dir: dir, ProbeInterval: probe, UnhealthyGrace: grace, BackoffInitial: backoff, BackoffMax: backoff},
		map[string]pluginmanager.Handler{testType: rec})
	p := startPlugin(t, dir, "ok", "-name", "victim")
	m.WaitSocket(p.path, pluginmanager.StateRegistered)

	killed := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-p.done
	if _, err := os.Lstat(p.path); err != nil {
		t.Fatalf("a SIGKILLed plugin should leave its socket: %v", err)
	}
	unhealthy := m.find("the killed plugin to be Unhealthy", on(p.path, pluginmanager.EventUnhealthy))
	endedAt(t, "Unhealthy", unhealthy.Time.Sub(killed), 0, probe)
	if s, _ := find(m.m.Plugins(), p.path); s.State != pluginmanager.StateUnhealthy && s.State != pluginmanager.StateFailed && s.State != pluginmanager.StateStale {
		t.Errorf("after the kill the plugin is %s", s.State)
	}
	dereg := m.find("the killed plugin to be deregistered", on(p.path, pluginmanager.EventDeregistered))
	endedAt(t, "deregistered after it became Unhealthy", dereg.Time.Sub(unhealthy.Time), grace, defaultUnhealthyGrace)
	if _, _, deregisters := rec.counts(); deregisters[p.path] != 1 {
		t.Errorf("the handler let it go %d times, want once", deregisters[p.path])
	}

	// It restarts, on the same socket name: a new socket, registered at once.
	restarted := time.Now()
	p2 := startPlugin(t, dir, "ok", "-name", "victim")
	again := m.status(p2.path, "registered after the restart", func(s pluginmanager.PluginStatus) bool {
		return s.State == pluginmanager.StateRegistered && s.RegisteredSince.After(restarted)
	})
	endedAt(t, "registered again", again.RegisteredSince.Sub(restarted), 0, backoff)
	if _, registers, _ := rec.counts(); registers[p.path] != 2 {
		t.Errorf("registered %d times, want twice (before the kill, after the restart)", registers[p.path])
	}
	rec.checkProblems(t)
}

// A plugin served by a process of a user the allow-list does not name is
// refused, and told which rule refused it.
func TestPeerNotOnAllowList(t *testing.T) {
	dir := testenv.ShortDir(t, "f")
	checkLeaks(t, dir)
	rec := newRecorder()
	other := uint32(os.Geteuid() + 4242)
	m := runManager(t, pluginmanager.Options{Dir: dir, AllowedPeers: &pluginmanager.Peers{UIDs: []uint32{other}}},
		map[string]pluginmanager.Handler{testType: rec})
	p := startPlugin(t, dir, "ok", "-name", "intruder")
	s := m.WaitSocket(p.path, pluginmanager.StateRejected)
	want := fmt.Sprintf("runs as uid %d", os.Geteuid())
	if s.Reason != pluginmanager.ReasonPolicy || !strings.Contains(s.LastError, want) || !strings.Contains(s.LastError, "Options.AllowedPeers") {
		t.Errorf("refusal = %s %q, want policy, naming the uid and the rule", s.Reason, s.LastError)
	}
	if line := p.logged("notified registered=false"); !strings.Contains(line, "AllowedPeers") {
		t.Errorf("the plugin was told %q", line)
	}
	if validates, _, _ := rec.counts(); validates[p.path] != 0 {
		t.Error("the handler saw a plugin the policy refused")
	}
}

// A plugin whose endpoint lies outside the allowed roots is refused.
func TestEndpointOutsideRoots(t *testing.T) {
	dir := testenv.ShortDir(t, "f")
	checkLeaks(t, dir)
	roots := testenv.ShortDir(t, "roots")
	m := runManager(t, pluginmanager.Options{Dir: dir, EndpointRoots: []string{roots}}, map[string]pluginmanager.Handler{testType: newRecorder()})
	out := startPlugin(t, dir, "ok", "-name", "outside", "-endpoint", "/var/run/elsewhere.sock")
	in := startPlugin(t, dir, "ok", "-name", "inside", "-endpoint", filepath.Join(roots, "csi.sock"))
	s := m.WaitSocket(out.path, pluginmanager.StateRejected)
	if s.Reason != pluginmanager.ReasonPolicy || !strings.Contains(s.LastError, "outside the directories Options.EndpointRoots allows") {
		t.Errorf("refusal = %s %q", s.Reason, s.LastError)
	}
	out.logged("notified registered=false")
	m.WaitSocket(in.path, pluginmanager.StateRegistered)
}

// A registry directory its group may write to is refused, unless allowed.
func TestGroupWritableDirRefused(t *testing.T) {
	dir := testenv.ShortDir(t, "f")
	if err := os.Chmod(dir, 0o770); err != nil {
		t.Fatal(err)
	}
	checkLeaks(t, dir)
	m, err := pluginmanager.New(pluginmanager.Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout)
	defer cancel()
	err = m.Run(ctx)
	if err == nil || !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), "AllowWritableDir") {
		t.Errorf("Run on a group-writable directory = %v", err)
	}
}

func find(ps []pluginmanager.PluginStatus, path string) (pluginmanager.PluginStatus, bool) {
	for _, p := range ps {
		if p.Socket == path {
			return p, true
		}
	}
	return pluginmanager.PluginStatus{}, false
}
