//go:build unix

package pluginmanager_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/plugd/plugd/internal/testenv"
	"github.com/plugd/plugd/pluginmanager"
	testingclock "k8s.io/utils/clock/testing"
)

// Dead sockets by the thousand, for an hour of the manager's time: what it
// logs must not grow with the retries. 20,000 of them once wrote 55 MB of
// warnings in 75 s, one per retry; now the first failure of each socket is
// a warning (100 a minute at most, then one line for the rest), retries
// that fail the same way are at debug level, and a summary every 5 minutes
// says how many are still failing.
func TestDeadSocketsDoNotFloodTheLog(t *testing.T) {
	n := 20000 // 75 s of fake time and an hour: 70 s of real time per mode
	if testing.Short() || raceDetector {
		n = 2000
	}
	for _, observe := range []bool{false, true} {
		name := "manage"
		if observe {
			name = "observe"
		}
		t.Run(name, func(t *testing.T) { deadSocketsLog(t, n, observe) })
	}
}

func deadSocketsLog(t *testing.T, n int, observe bool) {
	logs := newLogCount()
	clk := fakeClock()
	clk.Step(time.Minute) // the sockets are old: no grace for a socket that was just bound
	dir := testenv.ShortDir(t, "pm")
	for i := range n {
		testenv.DeadSocket(t, filepath.Join(dir, fmt.Sprintf("dead-%05d.sock", i)))
	}
	h := start(t, pluginmanager.Options{
		Dir:            dir,
		Logger:         slog.New(logs),
		Clock:          clk,
		Observe:        observe,
		BackoffInitial: 500 * time.Millisecond, // the defaults, which plugintest shortens
		BackoffMax:     2 * time.Minute,
		ResyncInterval: -1,
	}, nil)
	f := &flood{t: t, h: h, clk: clk, logs: logs, n: n, began: clk.Now()}

	first := "plugin registration failed"
	if observe {
		first = "plugin does not answer"
	}
	f.settle()
	// The first failure of each socket, up to the minute's warnings.
	if got := logs.warned(first); len(got) != 100 {
		t.Errorf("%d sockets went Stale at once: %d warnings %q, want 100 (the budget of a minute)", n, len(got), first)
	} else {
		for socket, c := range got {
			if c != 1 {
				t.Errorf("%s warned of %d times, want once", socket, c)
			}
		}
	}
	more := f.firstMinutes()
	f.anHour(more)
}

// flood is the run of deadSocketsLog: n dead sockets on a fake clock.
type flood struct {
	t     *testing.T
	h     *harness
	clk   *testingclock.FakeClock
	logs  *logCount
	n     int
	began time.Time
}

// settle waits until every socket has been looked at for what is due: each
// is Stale with its next retry after now. Time moves only then.
func (f *flood) settle() []pluginmanager.PluginStatus {
	f.t.Helper()
	deadline := time.Now().Add(5 * time.Minute) // a failure bound on a loaded machine, not a pace
	poll := time.Millisecond
	for {
		ps := f.h.m.Plugins()
		now := f.clk.Now()
		settled := len(ps) == f.n
		for _, s := range ps {
			if s.State != pluginmanager.StateStale || !s.NextRetry.After(now) {
				settled = false
				break
			}
		}
		if settled {
			return ps
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("%d sockets not all Stale and waiting for a retry at %s of fake time; log so far: %s", f.n, now.Sub(f.began), f.logs.figures())
		}
		time.Sleep(poll) // a poll of the condition, with the deadline above
		poll = min(2*poll, 20*time.Millisecond)
	}
}

// run moves the clock on by step until until has passed since the start,
// settling after each step, and returns the statuses then.
func (f *flood) run(until, step time.Duration) []pluginmanager.PluginStatus {
	f.t.Helper()
	ps := f.settle()
	for f.clk.Now().Sub(f.began) < until {
		f.clk.Step(min(step, until-f.clk.Now().Sub(f.began)))
		ps = f.settle()
	}
	return ps
}

// attempts is the attempts of every socket in ps.
func attempts(ps []pluginmanager.PluginStatus) int {
	total := 0
	for _, s := range ps {
		total += s.Attempts
	}
	return total
}

// firstMinutes runs 75 s: one line says how many failures were beyond the
// first minute's budget, and little is written. It returns that line.
func (f *flood) firstMinutes() []map[string]string {
	t, n := f.t, f.n
	ps := f.run(75*time.Second, 500*time.Millisecond)
	at75 := f.logs.snapshot()
	t.Logf("%d dead sockets, 75 s, %d failed attempts: %s", n, attempts(ps), at75)
	more := f.logs.find("more socket failures")
	if len(more) != 1 || more[0]["count"] != strconv.Itoa(n-100) || more[0]["byState"] != fmt.Sprintf("Stale=%d", n-100) {
		t.Errorf("the line for the failures beyond the budget: %v, want one with count=%d byState=Stale=%d", more, n-100, n-100)
	}
	if at75.warnBytes > 64<<10 || at75.bytes > 64<<10 {
		t.Errorf("75 s of %d dead sockets wrote %d bytes (%d of warnings), want at most 64 KiB", n, at75.bytes, at75.warnBytes)
	}
	return more
}

// anHour runs to an hour: a summary every 5 minutes, true to the sockets,
// and little else.
func (f *flood) anHour(more []map[string]string) {
	t, n := f.t, f.n
	ps := f.run(time.Hour, 5*time.Second)
	hour := f.logs.snapshot()
	total := attempts(ps)
	t.Logf("%d dead sockets, 1 h, %d failed attempts: %s", n, total, hour)
	if hour.bytes > 100<<10 {
		t.Errorf("an hour of %d dead sockets wrote %d bytes, want under 100 KiB", n, hour.bytes)
	}
	summaries := f.logs.find("sockets still failing")
	if len(more) > 0 && len(summaries) > 0 {
		t.Logf("the line for the rest: %v\nthe first summary: %v", more[0], summaries[0])
	}
	if len(summaries) < 10 || len(summaries) > 12 {
		t.Errorf("%d summaries in an hour, want one every 5 minutes", len(summaries))
	}
	sum := 0
	for _, s := range summaries {
		failures, _ := strconv.Atoi(s["failures"])
		sum += failures
		// A socket being tried again as the summary is written is
		// "retrying", not Stale: together they are every socket.
		retrying, _ := strconv.Atoi(s["retrying"])
		if s["failing"] != strconv.Itoa(n) || s["byState"] != fmt.Sprintf("Stale=%d", n-retrying) || s["byReason"] != fmt.Sprintf("dial=%d", n) || failures < n {
			t.Errorf("summary %v, want failing=%d byState=Stale=%d (and retrying=%d) byReason=dial=%d and at least a failure per socket", s, n, n-retrying, retrying, n)
		}
	}
	if sum > total {
		t.Errorf("the summaries count %d failures, more than the %d attempts made", sum, total)
	}
	if w := f.logs.warnLines(); w > 100+1+len(summaries) {
		t.Errorf("%d warnings in an hour: want the 100 first failures, the line for the rest, and the summaries", w)
	}
}

// logCount is a slog handler, at Info level as plugd logs by default, that
// writes text lines and counts them and their bytes, warnings apart, and
// keeps the attributes of each warning.
type logCount struct {
	h     slog.Handler
	state *logState
}

type logState struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	lines map[slog.Level]int
	bytes map[slog.Level]int
	warns []map[string]string // each warning's message (as "msg") and attributes
}

func newLogCount() *logCount {
	st := &logState{lines: map[slog.Level]int{}, bytes: map[slog.Level]int{}}
	return &logCount{h: slog.NewTextHandler(&st.buf, &slog.HandlerOptions{Level: slog.LevelInfo}), state: st}
}

func (l *logCount) Enabled(ctx context.Context, level slog.Level) bool {
	return l.h.Enabled(ctx, level)
}

func (l *logCount) Handle(ctx context.Context, r slog.Record) error {
	st := l.state
	st.mu.Lock()
	defer st.mu.Unlock()
	st.buf.Reset()
	if err := l.h.Handle(ctx, r); err != nil {
		return err
	}
	st.lines[r.Level]++
	st.bytes[r.Level] += st.buf.Len()
	if r.Level >= slog.LevelWarn {
		attrs := map[string]string{"msg": r.Message}
		r.Attrs(func(a slog.Attr) bool {
			attrs[a.Key] = a.Value.String()
			return true
		})
		st.warns = append(st.warns, attrs)
	}
	return nil
}

func (l *logCount) WithAttrs(as []slog.Attr) slog.Handler {
	return &logCount{h: l.h.WithAttrs(as), state: l.state}
}

func (l *logCount) WithGroup(name string) slog.Handler {
	return &logCount{h: l.h.WithGroup(name), state: l.state}
}

// logFigures are the counts at one time.
type logFigures struct {
	lines, bytes, warnLines, warnBytes int
}

func (f logFigures) String() string {
	return fmt.Sprintf("%d lines, %d bytes logged at Info and above; %d warnings, %d bytes", f.lines, f.bytes, f.warnLines, f.warnBytes)
}

func (l *logCount) snapshot() logFigures {
	st := l.state
	st.mu.Lock()
	defer st.mu.Unlock()
	var f logFigures
	for level, n := range st.lines {
		f.lines += n
		f.bytes += st.bytes[level]
		if level >= slog.LevelWarn {
			f.warnLines += n
			f.warnBytes += st.bytes[level]
		}
	}
	return f
}

func (l *logCount) figures() string { return l.snapshot().String() }

func (l *logCount) warnLines() int { return l.snapshot().warnLines }

// warned counts the warnings with message msg by socket.
func (l *logCount) warned(msg string) map[string]int {
	out := map[string]int{}
	for _, w := range l.find(msg) {
		out[w["socket"]]++
	}
	return out
}

// find returns the warnings whose message has s in it.
func (l *logCount) find(s string) []map[string]string {
	st := l.state
	st.mu.Lock()
	defer st.mu.Unlock()
	var out []map[string]string
	for _, w := range st.warns {
		if strings.Contains(w["msg"], s) {
			out = append(out, w)
		}
	}
	return out
}

// Sockets that take a connection and never say a word (issue 25, item 4)
// are each warned of once, however often they fail the same way. Their
// failure was said two ways, by whichever of two equal deadlines passed
// first (the dial's, GetInfo's), and each socket was warned of again at
// about every other attempt: 300 of them kept the log at its cap.
func TestSilentSocketsWarnedOnce(t *testing.T) {
	const n, rounds = 20, 6
	logs := newLogCount()
	clk := fakeClock()
	dir := testenv.ShortDir(t, "pm")
	for i := range n {
		serveConns(t, filepath.Join(dir, fmt.Sprintf("silent-%02d.sock", i)), func(_ *net.UnixListener, _ int32, c net.Conn) {
			io.Copy(io.Discard, c) // says nothing, until plugd hangs up
		})
	}
	clk.Step(time.Minute) // the sockets are old: no grace for a socket that was just bound
	h := start(t, pluginmanager.Options{Dir: dir, Logger: slog.New(logs), Clock: clk, ResyncInterval: -1,
		DialTimeout: 30 * time.Millisecond, GetInfoTimeout: 30 * time.Millisecond, // equal, as the defaults are
		BackoffInitial: time.Second, BackoffMax: time.Second}, nil)
	for round := 1; round <= rounds; round++ {
		h.Until(fmt.Sprintf("every silent socket failed %d times", round), func(ps []pluginmanager.PluginStatus) bool {
			now := clk.Now()
			for _, s := range ps {
				if s.Attempts < round || s.State != pluginmanager.StateFailed || !s.NextRetry.After(now) {
					return false
				}
			}
			return len(ps) == n
		})
		clk.Step(2 * time.Second)
	}
	warned := logs.warned("plugin registration failed")
	for socket, c := range warned {
		if c != 1 {
			t.Errorf("%s warned of %d times in %d failed attempts, want once", socket, c, rounds)
		}
	}
	if len(warned) != n {
		t.Errorf("%d sockets warned of, want %d", len(warned), n)
	}
	if s := h.m.Plugins()[0]; !strings.Contains(s.LastError, "no connection within 30ms: it took the connection and sent no HTTP/2 SETTINGS") {
		t.Errorf("a silent socket's error: %q", s.LastError)
	}
}
