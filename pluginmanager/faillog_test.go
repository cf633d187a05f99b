package pluginmanager

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestFailureLog(t *testing.T) {
	var buf bytes.Buffer
	r := &registry{log: slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo})), entries: map[string]*entry{}}
	warns := func() int { return strings.Count(buf.String(), "level=WARN msg=failed") }
	t0 := time.Unix(1e9, 0)
	fail := func(e *entry, at time.Time, reason Reason, msg string) {
		e.status.State, e.status.Reason, e.status.LastError = StateUnhealthy, reason, msg
		r.lock()
		r.failedLocked(e, at, "failed", "socket", e.status.Socket)
		r.unlock()
	}
	recovered := func(e *entry, at time.Time) slog.Level {
		r.lock()
		defer r.unlock()
		return r.recoveredLocked(e, at)
	}
	e := &entry{status: PluginStatus{Plugin: Plugin{Socket: "/flap"}}}
	r.entries["/flap"] = e

	fail(e, t0, ReasonEndpoint, "endpoint /x: lost after 3s")
	if warns() != 1 {
		t.Fatalf("the first failure: %d warnings, want 1:\n%s", warns(), buf.String())
	}
	if level := recovered(e, t0.Add(time.Second)); level != slog.LevelInfo {
		t.Errorf("recovery after a warning at %s, want Info", level)
	}
	// The same failure again, its numbers aside, a moment later: a flap.
	fail(e, t0.Add(2*time.Second), ReasonEndpoint, "endpoint /x: lost after 14s")
	if warns() != 1 {
		t.Errorf("a flap: %d warnings, want still 1", warns())
	}
	if level := recovered(e, t0.Add(3*time.Second)); level != slog.LevelDebug {
		t.Errorf("recovery after a flap at %s, want Debug", level)
	}
	// A different reason is news; so is the same failure long after.
	fail(e, t0.Add(4*time.Second), ReasonUnhealthy, "connect: refused")
	recovered(e, t0.Add(5*time.Second))
	fail(e, t0.Add(5*time.Second+failureSummaryEvery), ReasonUnhealthy, "connect: refused")
	if warns() != 3 || !strings.Contains(buf.String(), "1 sockets still failing") {
		t.Errorf("a new reason, then the same failure after %s: %d warnings, want 3, and a summary for the flap logged at debug level:\n%s", failureSummaryEvery, warns(), buf.String())
	}

	// 150 sockets failing at once, in a new window: 100 warnings, then one
	// line for the rest.
	t1 := t0.Add(time.Hour)
	for i := range 150 {
		e := &entry{status: PluginStatus{Plugin: Plugin{Socket: fmt.Sprintf("/s%d", i)}}}
		r.entries[e.status.Socket] = e
		fail(e, t1, ReasonDial, "refused")
	}
	if warns() != 103 {
		t.Errorf("150 at once: %d warnings in all, want 103", warns())
	}
	fail(r.entries["/s0"], t1.Add(failureWindow), ReasonDial, "refused") // a repeat, after the window
	if !strings.Contains(buf.String(), `msg="50 more socket failures within 1m0s`) || !strings.Contains(buf.String(), `byState="Unhealthy=50"`) {
		t.Errorf("no line for the 50 beyond the budget:\n%s", buf.String())
	}
	// A summary once failures went unlogged for an interval.
	fail(r.entries["/s1"], t1.Add(failureSummaryEvery+failureWindow), ReasonDial, "refused")
	if !strings.Contains(buf.String(), "151 sockets still failing") || !strings.Contains(buf.String(), "byReason=\"dial=150 unhealthy=1\"") {
		t.Errorf("no summary of the 151 failing:\n%s", buf.String())
	}
}

// Failures that are not retried (150 sockets Rejected at once) still get
// the line for those beyond the budget, and the summary, from the periodic
// tick: no later failure is needed to carry them.
func TestFailureLogTick(t *testing.T) {
	var buf bytes.Buffer
	r := &registry{log: slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo})), entries: map[string]*entry{}}
	t0 := time.Unix(1e9, 0)
	for i := range 150 {
		e := &entry{status: PluginStatus{Plugin: Plugin{Socket: fmt.Sprintf("/r%d", i)}, State: StateFailed, Reason: ReasonNoHandler, LastError: "no handler"}}
		r.entries[e.status.Socket] = e
		r.lock()
		r.failedLocked(e, t0, "rejected", "socket", e.status.Socket)
		r.unlock()
	}
	tick := func(at time.Time) {
		r.lock()
		r.tickLocked(at)
		r.unlock()
	}
	tick(t0.Add(failureWindow / 2))
	if strings.Contains(buf.String(), "more socket failures") {
		t.Fatalf("the window's line before its end:\n%s", buf.String())
	}
	tick(t0.Add(failureWindow))
	if !strings.Contains(buf.String(), `msg="50 more socket failures within 1m0s`) {
		t.Errorf("no line for the 50 beyond the budget at the window's end:\n%s", buf.String())
	}
	tick(t0.Add(failureSummaryEvery))
	if !strings.Contains(buf.String(), "150 sockets still failing") {
		t.Errorf("no summary at its interval's end:\n%s", buf.String())
	}
	n := strings.Count(buf.String(), "sockets still failing")
	tick(t0.Add(3 * failureSummaryEvery))
	if got := strings.Count(buf.String(), "sockets still failing"); got != n {
		t.Errorf("%d summaries after ticks with no failure since the last, want %d", got, n)
	}
}

// Issue 33, info: a summary that counts no socket still failing (the
// failures since the last one all recovered) is logged at info, not as a
// warning.
func TestFailureSummaryOfNoneIsInfo(t *testing.T) {
	var buf bytes.Buffer
	r := &registry{log: slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo})), entries: map[string]*entry{}}
	t0 := time.Unix(1e9, 0)
	e := &entry{status: PluginStatus{Plugin: Plugin{Socket: "/f"}, State: StateFailed, Reason: ReasonDial, LastError: "refused"}}
	r.entries["/f"] = e
	r.lock()
	r.failedLocked(e, t0, "failed", "socket", "/f")
	r.failedLocked(e, t0.Add(2*time.Second), "failed", "socket", "/f") // the same again: not logged one by one
	e.status.State, e.status.Reason = StateRegistered, ""              // recovered
	r.tickLocked(t0.Add(failureSummaryEvery))
	r.unlock()
	line := ""
	for _, l := range strings.Split(buf.String(), "\n") {
		if strings.Contains(l, "sockets still failing") {
			line = l
		}
	}
	if !strings.Contains(line, "level=INFO") || !strings.Contains(line, "0 sockets still failing") {
		t.Errorf("the summary of none failing: %q, want it at INFO\n%s", line, buf.String())
	}
}
