package pluginmanager

import (
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"
)

// Failures are logged by what changes, not by attempt. 20,000 dead sockets
// retried with backoff once wrote a warning per retry: 55 MB in 75 s. Now
// a socket's failure is a warning when the socket's state, reason or the
// gist of its error differ from the failure last warned of for that socket
// file; a retry that fails the same way is logged at debug level. So that
// an operator still sees that failures go on, a summary of the sockets
// still failing is logged at most every failureSummaryEvery, if any failure
// was kept out of the warnings since the last; and so that many sockets
// failing at once (20,000 going Stale when their plugins' node is
// restarted) do not write a line each, at most failureWarnings warnings are
// written per failureWindow, all sockets together, and one line then says
// how many more there were. Nothing is lost: every failure stays in the
// socket's status, its events and the metrics.
//
// It all runs lazily, when a failure is recorded: no timer, no goroutine,
// and the manager's clock, so tests step it.
const (
	failureWarnings     = 100
	failureWindow       = time.Minute
	failureSummaryEvery = 5 * time.Minute
	failureGistLen      = 160
)

// failureLog is the state of that accounting. It is guarded by registry.mu,
// under which every failure is recorded; what it logs is said there
// (registry.say) and written once the lock is free.
type failureLog struct {
	windowEnd time.Time     // the end of the current window of warnings; zero: none open
	warned    int           // warnings written in the window
	held      map[State]int // failures of the window beyond its warnings, by state
	since     time.Time     // the start of the summary's interval; zero: no failure yet
	attempts  int           // failures recorded since
	quiet     int           // of which not warned of
}

// failureSaid is what the log said of one socket file's failures.
type failureSaid struct {
	key       string    // the failure last warned of (failureKey)
	recovered time.Time // when it last succeeded since
	quiet     bool      // its last failure was not warned of
}

// failedLocked logs a failure just recorded in e's status (msg and args say
// what failed): a warning if it is not the failure last warned of for the
// socket file (or that one again, but after more than
// failureSummaryEvery of success) and the window's warnings are not
// spent, else at debug level. So a plugin that flaps is warned of once
// every failureSummaryEvery at most.
func (r *registry) failedLocked(e *entry, now time.Time, msg string, args ...any) {
	s := &e.said
	key := failureKey(e.status)
	if key == s.key && (s.recovered.IsZero() || now.Sub(s.recovered) < failureSummaryEvery) {
		s.quiet = true
		r.repeatedLocked(now, msg, args...)
		return
	}
	*s = failureSaid{key: key}
	r.warnLocked(e, now, msg, args...)
}

// repeatedLocked logs, at debug level, a failure of e that its caller found
// to be the same as the last one recorded.
func (r *registry) repeatedLocked(now time.Time, msg string, args ...any) {
	r.countFailureLocked(now, false)
	r.say(slog.LevelDebug, msg, args...)
}

// warnLocked writes a warning about e, within the window's warnings; beyond
// them it is logged at debug level and counted in the line that says how
// many more there were.
func (r *registry) warnLocked(e *entry, now time.Time, msg string, args ...any) {
	l := &r.fails
	r.rollLocked(now)
	if l.windowEnd.IsZero() {
		l.windowEnd = now.Add(failureWindow)
	}
	warn := l.warned < failureWarnings
	r.countFailureLocked(now, warn)
	if warn {
		l.warned++
		r.say(slog.LevelWarn, msg, args...)
		return
	}
	if l.held == nil {
		l.held = make(map[State]int)
	}
	l.held[e.status.State]++
	r.say(slog.LevelDebug, msg, args...)
}

// recoveredLocked records that e succeeded at now, and returns the level
// to say so at: Info, or Debug after a failure that was logged at
// debug level as the repeat of one warned of (a flap).
func (r *registry) recoveredLocked(e *entry, now time.Time) slog.Level {
	s := &e.said
	level := slog.LevelInfo
	if s.quiet {
		level = slog.LevelDebug
	}
	s.quiet = false
	if s.key != "" {
		s.recovered = now
	}
	return level
}

// countFailureLocked counts a failure for the summary, and writes the
// summary (and the count of the window that ended) first if it is due.
func (r *registry) countFailureLocked(now time.Time, warned bool) {
	l := &r.fails
	r.tickLocked(now)
	if l.since.IsZero() {
		l.since = now
	}
	l.attempts++
	if !warned {
		l.quiet++
	}
}

// tickLocked writes what is due with no failure to carry it (the window's
// count of failures not logged one by one, the summary), so that a burst of
// failures that are not retried (Rejected sockets) or that stopped is still
// told within a resync interval. The periodic resync calls it.
func (r *registry) tickLocked(now time.Time) {
	r.rollLocked(now)
	l := &r.fails
	if !l.since.IsZero() && now.Sub(l.since) >= failureSummaryEvery {
		if l.quiet > 0 {
			r.summaryLocked(now)
		}
		l.since, l.attempts, l.quiet = time.Time{}, 0, 0 // the next failure opens the next interval
	}
}

// rollLocked ends the window of warnings if its time is over, saying how
// many failures it did not write.
func (r *registry) rollLocked(now time.Time) {
	l := &r.fails
	if l.windowEnd.IsZero() || now.Before(l.windowEnd) {
		return
	}
	if n := sum(l.held); n > 0 {
		r.say(slog.LevelWarn, fmt.Sprintf("%d more socket failures within %s were not logged one by one; every socket's state is in plugctl list, its events and plugd_registration_failures_total", n, failureWindow),
			"count", n, "byState", counts(l.held), "logged", l.warned)
	}
	l.windowEnd, l.warned = time.Time{}, 0
	clear(l.held)
}

// summaryLocked says how many sockets are failing, by state and reason, and
// how many failures were recorded since the last summary.
func (r *registry) summaryLocked(now time.Time) {
	l := &r.fails
	byState, byReason := make(map[State]int), make(map[Reason]int)
	retrying := 0
	for _, e := range r.entries {
		switch e.status.State {
		case StateFailed, StateStale, StateUnhealthy, StateNotAnswering:
			byState[e.status.State]++
			byReason[e.status.Reason]++
		case StateRegistering:
			// Being tried again as this is written: still failing, as
			// far as anyone knows, with the reason of its last failure.
			if e.status.Reason != "" {
				retrying++
				byReason[e.status.Reason]++
			}
		}
	}
	n := sum(byState) + retrying
	level := slog.LevelWarn
	if n == 0 {
		level = slog.LevelInfo // the failures since the last summary are over: nothing to warn of
	}
	r.say(level, fmt.Sprintf("%d sockets still failing; their repeated failures are logged at debug level, and each is in plugctl list", n),
		"failing", n, "byState", counts(byState), "retrying", retrying, "byReason", counts(byReason),
		"failures", l.attempts, "notLoggedOneByOne", l.quiet, "since", l.since, "over", now.Sub(l.since).Round(time.Second))
}

// failureKey is what tells one failure of a socket from another: its
// state, reason and the gist of its error.
func failureKey(s PluginStatus) string {
	return string(s.State) + "\x00" + string(s.Reason) + "\x00" + gist(s.LastError)
}

// gist is an error message without its numbers (ports, counts, times,
// durations), cut short: what makes two errors the same failure.
func gist(msg string) string {
	var b strings.Builder
	digits := false
	for _, c := range msg {
		if c >= '0' && c <= '9' {
			if !digits {
				b.WriteByte('#')
			}
			digits = true
			continue
		}
		digits = false
		b.WriteRune(c)
		if b.Len() >= failureGistLen {
			break
		}
	}
	return b.String()
}

func sum[K comparable](m map[K]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// counts is m as "a=1 b=2", by key.
func counts[K ~string](m map[K]int) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(m)) {
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s=%d", k, m[k])
	}
	return b.String()
}
