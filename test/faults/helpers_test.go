package faults

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/plugd/plugd/internal/testenv"
	"github.com/plugd/plugd/plugin"
	"github.com/plugd/plugd/pluginmanager"
	"github.com/plugd/plugd/plugintest"
)

// faultplugin is the path of the fault plugin binary, built once by TestMain.
var faultplugin string

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "faults-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	faultplugin = filepath.Join(dir, "faultplugin")
	if err := testenv.Build(dir, "test/faults/faultplugin"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	return code
}

// endedAt checks that took, how long something waited before it ended, is
// at least least (the deadline or grace period the test set, which must have
// passed) and less than before: the next longer bound that could have ended
// it instead, the manager's default for the same wait, which it would use if
// it ignored the test's. So the check shows which bound fired, and allows
// any lateness short of the other one: on 2 cores busy with
// go test -race ./..., an event may come seconds after its deadline, more
// than a fixed slack can promise.
func endedAt(t *testing.T, what string, took, least, before time.Duration) {
	t.Helper()
	if took < least || took >= before {
		t.Errorf("%s after %s, want at its %s (and before %s, another bound)", what, took, least, before)
	}
}

// The manager's defaults (pluginmanager.Options) that a test's own bound
// must be told apart from.
const (
	defaultCallTimeout    = 5 * time.Second  // DialTimeout, GetInfoTimeout, NotifyTimeout
	defaultUnhealthyGrace = 30 * time.Second // UnhealthyGrace
)

// testType is the plugin type the faultplugin sends unless told otherwise.
const testType = "example.com/Fault"

// leakCheck is what the test process held before a test started: at the end
// of the test it must hold no more.
type leakCheck struct {
	t   *testing.T
	dir string
	fds map[int]string
}

// checkLeaks notes the goroutines and file descriptors of the test process
// now, and checks at the end of the test that no goroutine was left running,
// no file descriptor left open and no socket file left in dir (every test
// here removes what it made itself). Call it before starting anything the
// test stops: cleanups run last-registered first, so the check runs after
// the manager has stopped and the plugin processes have exited, and before
// dir, if it was made earlier by testenv.ShortDir, is removed.
func checkLeaks(t *testing.T, dir string) {
	t.Helper()
	l := &leakCheck{t: t, dir: dir, fds: openFDs(t)}
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() {
		if err := goleak.Find(ignore); err != nil {
			t.Errorf("goroutines left running: %v", err)
		}
		l.checkFDs()
		l.checkSockets()
	})
}

// checkFDs reports every file descriptor open now that was not at the start.
// No slack is needed, and no second look: the descriptors the runtime keeps
// (the netpoller's epoll and eventfd, the cgroup CPU quota files) are open
// before the first test, and everything the tests open is closed by the time
// the manager's Run, the SDK's Close and exec's Wait have returned.
func (l *leakCheck) checkFDs() {
	now := openFDs(l.t)
	var extra []string
	for fd, target := range now {
		if was, ok := l.fds[fd]; !ok || was != target {
			extra = append(extra, fmt.Sprintf("%d -> %s", fd, target))
		}
	}
	if len(extra) > 0 {
		slices.Sort(extra)
		l.t.Errorf("file descriptors left open (%d at the start, %d now): %q", len(l.fds), len(now), extra)
	}
}

// checkSockets reports every socket file left under the directory.
func (l *leakCheck) checkSockets() {
	for _, path := range socketsIn(l.t, l.dir) {
		l.t.Errorf("socket left behind in the registry directory: %s", path)
	}
}

// openFDs maps each open file descriptor of this process to what it refers to.
// The descriptor os.ReadDir itself opens on /proc/self/fd is left out.
func openFDs(t testing.TB) map[int]string {
	t.Helper()
	f, err := os.Open("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		t.Fatal(err)
	}
	fds := make(map[int]string, len(names))
	for _, name := range names {
		fd, err := strconv.Atoi(name)
		if err != nil || uintptr(fd) == f.Fd() {
			continue
		}
		target, err := os.Readlink("/proc/self/fd/" + name)
		if err != nil {
			continue // closed since the listing
		}
		fds[fd] = target
	}
	return fds
}

// socketsIn lists the socket files under dir, at any depth. A missing dir has none.
func socketsIn(t testing.TB, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if d.Type()&fs.ModeSocket != 0 {
			out = append(out, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// heapInuse is the heap in use after a collection, for before/after comparisons.
func heapInuse() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

const mib = 1 << 20

// manager is a pluginmanager.Manager running in the test process, through
// plugintest, with every event of the run kept for find.
type manager struct {
	*plugintest.Manager
	t       *testing.T
	m       *pluginmanager.Manager
	dir     string
	sub     *pluginmanager.Subscription // the run's events, for find and events
	log     *tailBuffer
	started time.Time

	// history is every event read so far, for find; nil if keepHistory is off.
	history     []pluginmanager.Event
	keepHistory bool
}

// runManager starts a manager with opts (zero timings get short test values)
// and handlers, and stops it at the end of the test. Its log is shown if the
// test fails. Its Timeout (how long its waits and find wait) is wait.
func runManager(t *testing.T, opts pluginmanager.Options, handlers map[string]pluginmanager.Handler) *manager {
	t.Helper()
	setDefault := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	setDefault(&opts.DialTimeout, time.Second)
	setDefault(&opts.GetInfoTimeout, time.Second)
	setDefault(&opts.NotifyTimeout, time.Second)
	setDefault(&opts.HandlerTimeout, 2*time.Second)
	buf := &tailBuffer{max: 256 << 10}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	t.Cleanup(func() { // after the manager stopped
		if t.Failed() {
			t.Logf("the manager's log (its last %d KiB):\n%s", buf.max>>10, buf)
		}
	})
	started := time.Now()
	pm := plugintest.NewManagerWith(t, opts, handlers)
	pm.Timeout = testenv.Timeout
	m := &manager{Manager: pm, t: t, m: pm.Manager(), dir: pm.Dir, sub: pm.Manager().SubscribeWithReplay(1 << 20), log: buf, started: started, keepHistory: true}
	t.Cleanup(m.sub.Close)
	return m
}

// next waits for the manager's next event until deadline; ok is false at the deadline.
func (m *manager) next(deadline <-chan time.Time) (ev pluginmanager.Event, ok bool) {
	m.t.Helper()
	select {
	case ev, open := <-m.sub.Events():
		if !open {
			m.t.Fatal("the manager's event stream ended: Run returned")
		}
		if m.keepHistory {
			m.history = append(m.history, ev)
		}
		return ev, true
	case <-deadline:
		return pluginmanager.Event{}, false
	}
}

// status waits until the socket at path satisfies cond, and returns its status.
func (m *manager) status(path, what string, cond func(pluginmanager.PluginStatus) bool) pluginmanager.PluginStatus {
	m.t.Helper()
	var got pluginmanager.PluginStatus
	m.Until(filepath.Base(path)+" to be "+what, func(ps []pluginmanager.PluginStatus) bool {
		p, ok := plugintest.Find(ps, path)
		got = p
		return ok && cond(p)
	})
	return got
}

// verdict waits for the manager to have tried the socket at path and decided:
// Registered, Rejected, or Failed at a step past the dial (a dial refused
// between a raw server's bind and its listen is retried at once).
func (m *manager) verdict(path string) pluginmanager.PluginStatus {
	m.t.Helper()
	return m.status(path, "decided", func(p pluginmanager.PluginStatus) bool {
		switch p.State {
		case pluginmanager.StateRegistered, pluginmanager.StateRejected:
			return true
		case pluginmanager.StateFailed:
			return p.Reason != pluginmanager.ReasonDial
		}
		return false
	})
}

// find returns the first event of the run that match accepts, reading more
// events until one comes.
func (m *manager) find(what string, match func(pluginmanager.Event) bool) pluginmanager.Event {
	m.t.Helper()
	if i := slices.IndexFunc(m.history, match); i >= 0 {
		return m.history[i]
	}
	deadline := time.After(m.Timeout)
	for {
		ev, ok := m.next(deadline)
		if !ok {
			m.t.Fatalf("timed out after %s waiting for %s; plugins: %s", m.Timeout, what, plugintest.Summary(m.m.Plugins()))
		}
		if match(ev) {
			return ev
		}
	}
}

// on matches events of type typ for the socket at path.
func on(path string, typ pluginmanager.EventType) func(pluginmanager.Event) bool {
	return func(ev pluginmanager.Event) bool { return ev.Plugin.Socket == path && ev.Type == typ }
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.b = append(b.b, p...)
	if over := len(b.b) - b.max; over > 0 {
		b.b = append(b.b[:0], b.b[over:]...)
	}
	return len(p), nil
}

func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.b)
}

// startSDKPlugin serves a well-behaved plugin called name in the test
// process, with the plugin SDK, until the end of the test.
func startSDKPlugin(t *testing.T, dir, name string) *plugin.Server {
	t.Helper()
	s, err := plugin.Start(plugin.Config{Dir: dir, Type: testType, Name: name, Versions: []string{"1.0.0"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// proc is a faultplugin process.
type proc struct {
	t      *testing.T
	name   string
	path   string // its registration socket
	cmd    *exec.Cmd
	stdout *lines
	stderr *lines
	done   chan struct{}
	err    error
}

// startPlugin runs faultplugin in mode with its socket in dir, and waits
// until it says it is ready. args are more flags (-name, -type, -socket);
// the name defaults to mode. The end of the test stops it with SIGTERM.
func startPlugin(t *testing.T, dir, mode string, args ...string) *proc {
	t.Helper()
	name, socket := mode, ""
	for i := 0; i+1 < len(args); i += 2 {
		switch args[i] {
		case "-name":
			name = args[i+1]
		case "-socket":
			socket = args[i+1]
		}
	}
	if socket == "" {
		socket = name + ".sock"
	}
	p := &proc{
		t:      t,
		name:   name,
		path:   filepath.Join(dir, socket),
		cmd:    exec.Command(faultplugin, append([]string{"-dir", dir, "-mode", mode, "-name", name}, args...)...),
		stdout: newLines(),
		stderr: newLines(),
		done:   make(chan struct{}),
	}
	p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(p.stop)
	if _, ok := p.stdout.waitFor("ready", p.done); !ok {
		t.Fatalf("faultplugin %s did not get ready: %v\nstderr:\n%s", name, p.err, p.stderr)
	}
	return p
}

// stop sends SIGTERM and waits for a clean exit. It may be called more than once.
func (p *proc) stop() {
	p.t.Helper()
	select {
	case <-p.done:
		return
	default:
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		p.t.Errorf("signalling faultplugin %s: %v", p.name, err)
	}
	select {
	case <-p.done:
	case <-time.After(testenv.Timeout):
		p.cmd.Process.Kill()
		<-p.done
		p.t.Errorf("faultplugin %s did not exit on SIGTERM; killed", p.name)
	}
	if p.err != nil {
		p.t.Errorf("faultplugin %s: %v\nstderr:\n%s", p.name, p.err, p.stderr)
	}
}

// logged waits for a line on the plugin's stderr that contains s, and returns it.
func (p *proc) logged(s string) string {
	p.t.Helper()
	line, ok := p.stderr.waitFor(s, p.done)
	if !ok {
		p.t.Fatalf("faultplugin %s never logged %q; stderr:\n%s", p.name, s, p.stderr)
	}
	return line
}

// lines collects what a process writes, line by line, and lets a test wait
// for a line.
type lines struct {
	mu      sync.Mutex
	partial bytes.Buffer
	all     []string
	changed chan struct{} // closed and replaced when a line arrives
}

func newLines() *lines { return &lines{changed: make(chan struct{})} }

func (l *lines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.partial.Write(p)
	added := false
	for {
		line, err := l.partial.ReadString('\n')
		if err != nil {
			l.partial.WriteString(line) // no newline yet: keep it for the next write
			break
		}
		l.all = append(l.all, strings.TrimSuffix(line, "\n"))
		added = true
	}
	if added {
		close(l.changed)
		l.changed = make(chan struct{})
	}
	return len(p), nil
}

func (l *lines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.all, "\n")
}

// count returns how many lines contain s.
func (l *lines) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, line := range l.all {
		if strings.Contains(line, s) {
			n++
		}
	}
	return n
}

// waitFor waits for a line containing s; ok is false at the deadline, or if
// exited is closed and no such line came: once the process has been waited
// for, every line it wrote is in (exec waits for its copying goroutines).
func (l *lines) waitFor(s string, exited <-chan struct{}) (line string, ok bool) {
	deadline := time.After(testenv.Timeout)
	for last := false; ; {
		l.mu.Lock()
		i := slices.IndexFunc(l.all, func(line string) bool { return strings.Contains(line, s) })
		changed := l.changed
		if i >= 0 {
			line = l.all[i]
		}
		l.mu.Unlock()
		if i >= 0 {
			return line, true
		}
		if last {
			return "", false
		}
		select {
		case <-changed:
		case <-exited:
			last = true
		case <-deadline:
			return "", false
		}
	}
}

// recorder is a handler that records what it holds and how often each socket
// was registered, and notes any Register of a socket it already holds.
type recorder struct {
	mu          sync.Mutex
	held        map[string]pluginmanager.Plugin // by socket
	validates   map[string]int
	registers   map[string]int
	deregisters map[string]int
	problems    []string
}

func newRecorder() *recorder {
	return &recorder{
		held:        map[string]pluginmanager.Plugin{},
		validates:   map[string]int{},
		registers:   map[string]int{},
		deregisters: map[string]int{},
	}
}

func (r *recorder) Validate(_ context.Context, p pluginmanager.Plugin) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.validates[p.Socket]++
	return nil
}

func (r *recorder) Register(_ context.Context, p pluginmanager.Plugin) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.registers[p.Socket]++
	if _, dup := r.held[p.Socket]; dup {
		r.problems = append(r.problems, "Register of "+filepath.Base(p.Socket)+", which the handler already holds")
	}
	r.held[p.Socket] = p
	return nil
}

func (r *recorder) Deregister(_ context.Context, p pluginmanager.Plugin) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.deregisters[p.Socket]++
	if _, ok := r.held[p.Socket]; !ok {
		r.problems = append(r.problems, "Deregister of "+filepath.Base(p.Socket)+", which the handler does not hold")
	}
	delete(r.held, p.Socket)
}

// heldSockets returns the sockets of the plugins the handler holds, sorted.
func (r *recorder) heldSockets() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Sorted(maps.Keys(r.held))
}

// counts returns copies of the per-socket call counts.
func (r *recorder) counts() (validates, registers, deregisters map[string]int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.validates), maps.Clone(r.registers), maps.Clone(r.deregisters)
}

// checkProblems fails the test if the handler saw a double Register or a
// Deregister of what it did not hold.
func (r *recorder) checkProblems(t *testing.T) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.problems) > 0 {
		t.Errorf("the handler was called out of turn (%d times): %q", len(r.problems), r.problems[:min(len(r.problems), 20)])
	}
}
