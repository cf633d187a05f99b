package demo

import (
	"bytes"
	"context"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/plugd/plugd/internal/testenv"
	"github.com/plugd/plugd/plugin"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testTimeout bounds a whole run; each step has its own, shorter, deadline.
const testTimeout = 2 * time.Minute

func TestRun(t *testing.T) {
	root := tempRoot(t)
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	defer cancel()
	var out bytes.Buffer
	if err := run(ctx, &out, options{Once: true}); err != nil {
		t.Fatalf("run: %v\noutput:\n%s", err, &out)
	}
	checkScenario(t, out.String())
	assertNoLeftovers(t, root, out.String())
}

// checkScenario checks the events of every step, in order where order
// matters, and the final table.
func checkScenario(t *testing.T, output string) {
	t.Helper()
	lines := strings.Split(output, "\n")
	// find returns the index of the first line at or after from that
	// contains every one of parts, failing the test if there is none.
	find := func(from int, parts ...string) int {
		t.Helper()
		for i := from; i < len(lines); i++ {
			if containsAll(lines[i], parts...) {
				return i
			}
		}
		t.Errorf("no line after line %d contains all of %q", from+1, parts)
		return len(lines)
	}

	// The first line is said before plugd starts; the second once it
	// answers, with the time it took.
	if len(lines) < 2 || lines[0] != "plugd demo: starting plugd in this process..." ||
		!regexp.MustCompile(`^plugd demo: plugd answers on its status API, after [0-9.]+m?s\.$`).MatchString(lines[1]) {
		t.Errorf("the demo does not say it is starting plugd, then after how long plugd answers:\n%s", strings.Join(lines[:min(3, len(lines))], "\n"))
	}
	find(0, "In another terminal: go run ./cmd/plugctl --socket ", "plugd.sock list")
	find(0, "Registered", "CSIPlugin", "csi.example.com", "csi.sock", "versions 1.0.0")
	find(0, "Registered", "DRAPlugin", "dra.example.com", "dra.sock", "versions v1.DRAPlugin")
	find(0, "Registered", "DevicePlugin", "example.com/gpu", "gpu.sock", "versions v1beta1")
	find(0, "Registered", "example.com/Greeter", "greeter.example.com", "greeter.sock", "versions v1")
	rejected := find(0, "Rejected", "csi-bad.sock", `invalid_info: invalid plugin info: endpoint "csi/driver.sock" is not an absolute path`)
	find(rejected, `the plugin was told: not registered: invalid plugin info: endpoint "csi/driver.sock" is not an absolute path`)
	find(0, "Rejected", "example.com/Unknown", "mystery.sock", "no_handler:", `"example.com/Unknown"`)
	find(find(0, "Deregistered", "greeter.sock"), "Removed", "greeter.sock")
	failed := find(0, "Failed", "fpga.sock", "attempt 3", "retry in", "connection refused")
	find(failed, "GET /v1/plugins/fpga.sock: Stale after 3 attempts")
	find(failed, "Registered", "DevicePlugin", "example.com/fpga", "fpga.sock")
	find(failed, "after the restart, on attempt 1 of the new socket")

	// The last table is the final state.
	last := -1
	for i, l := range lines {
		if strings.Contains(l, "GET /v1/plugins at") {
			last = i
		}
	}
	if last < 0 {
		t.Fatalf("no table in the output:\n%s", output)
	}
	if !strings.Contains(lines[last], "6 plugins: 4 Registered, 2 Rejected") {
		t.Errorf("final table's summary is %q, want 6 plugins: 4 Registered, 2 Rejected", lines[last])
	}
	got := tableStates(lines[last+2:])
	want := map[string]string{
		"csi.sock": "Registered", "dra.sock": "Registered", "gpu.sock": "Registered", "fpga.sock": "Registered",
		"csi-bad.sock": "Rejected", "mystery.sock": "Rejected",
	}
	if !maps.Equal(got, want) {
		t.Errorf("final table: states %v, want %v", got, want)
	}
	if t.Failed() {
		t.Logf("output:\n%s", output)
	}
}

// tableStates reads ID -> STATE from a table's rows, up to the first blank line.
func tableStates(rows []string) map[string]string {
	states := make(map[string]string)
	for _, r := range rows {
		f := strings.Fields(r)
		if len(f) < 5 {
			break
		}
		states[f[0]] = f[3]
	}
	return states
}

// Cancelling the context (Ctrl-C) midway stops the demo cleanly: no error,
// nothing left behind, and no goroutine (TestMain checks).
func TestRunInterrupted(t *testing.T) {
	root := tempRoot(t)
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	defer cancel()
	// Cancelled as soon as step 2's event is printed, while plugd and four
	// plugins run.
	out := &syncBuffer{onWrite: func(s string) {
		if strings.Contains(s, "Rejected") {
			cancel()
		}
	}}
	if err := run(ctx, out, options{Once: true}); err != nil {
		t.Fatalf("run, cancelled midway: %v, want nil\noutput:\n%s", err, out)
	}
	s := out.String()
	for _, want := range []string{"Interrupted: stopping the example plugins, then plugd.", "Stopped: the example plugins and plugd; removed "} {
		if !strings.Contains(s, want) {
			t.Errorf("output lacks %q:\n%s", want, s)
		}
	}
	if strings.Contains(s, "5. A device plugin crashed") {
		t.Errorf("the scenario went on after the cancellation:\n%s", s)
	}
	assertNoLeftovers(t, root, s)
}

// A context cancelled before the demo starts ends it before plugd answers,
// still without an error or leftovers.
func TestRunCancelledAtOnce(t *testing.T) {
	root := tempRoot(t)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	var out bytes.Buffer
	if err := run(ctx, &out, options{}); err != nil {
		t.Fatalf("run with a cancelled context: %v, want nil\noutput:\n%s", err, &out)
	}
	assertNoLeftovers(t, root, out.String())
}

// A demo that fails says why, and still leaves nothing behind.
func TestRunFailure(t *testing.T) {
	root := tempRoot(t)
	var out bytes.Buffer
	// No daemon answers within a nanosecond.
	err := run(t.Context(), &out, options{Once: true, StepTimeout: time.Nanosecond})
	if err == nil || !strings.Contains(err.Error(), "plugd's status API did not answer on ") {
		t.Fatalf("run with a 1ns step timeout: %v, want an error saying plugd did not answer\noutput:\n%s", err, &out)
	}
	t.Logf("the error, as plugd demo would print it: %v", err)
	assertNoLeftovers(t, root, out.String())
}

// After the scenario, without --once, the demo follows plugd's events until
// cancelled: a plugin started from outside shows up, and on a terminal the
// table is redrawn in place and fits its width.
func TestRunLive(t *testing.T) {
	root := tempRoot(t)
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	defer cancel()
	const width = 100
	out := &syncBuffer{}
	done := make(chan error, 1)
	go func() { done <- run(ctx, out, options{TermWidth: func() int { return width }}) }()
	// Stop the run whatever happens below, and wait for it.
	stopped := false
	stop := func() error {
		if stopped {
			return nil
		}
		stopped = true
		cancel()
		return <-done
	}
	defer stop()

	s := out.waitFor(t, ctx, "plugd keeps running until Ctrl-C")
	m := regexp.MustCompile(`registry directory  (\S+)`).FindStringSubmatch(s)
	if m == nil {
		t.Fatalf("no registry directory in the output:\n%s", s)
	}
	// As a user would, in another terminal.
	p, err := plugin.Start(plugin.Config{Dir: m[1], Type: typeGreeter, Name: "mine.example.com", Socket: "mine.sock", Versions: []string{"v1"}})
	if err != nil {
		t.Fatal(err)
	}
	out.waitFor(t, ctx, "7 plugins: 5 Registered, 2 Rejected")
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	out.waitFor(t, ctx, "Removed      example.com/Greeter mine.example.com")
	if err := stop(); err != nil {
		t.Fatalf("run: %v\noutput:\n%s", err, out)
	}

	s = out.String()
	// From the event header that follows the hints on.
	live := s[strings.Index(s, "plugd keeps running"):]
	live = live[strings.Index(live, "\nTIME "):]
	if !strings.Contains(live, "\x1b[J") {
		t.Errorf("on a terminal, the live table is not redrawn in place:\n%q", live)
	}
	for _, l := range strings.Split(live, "\n") {
		if strings.HasPrefix(l, "  ") && len([]rune(l)) >= width {
			t.Errorf("table line %q is %d runes, wider than the terminal's %d", l, len([]rune(l)), width)
		}
	}
	if !strings.Contains(s, "Stopped: the example plugins and plugd; removed ") {
		t.Errorf("output lacks the final Stopped line:\n%s", s)
	}
	assertNoLeftovers(t, root, s)
}

// The command line, as plugd runs it.
func TestCommandOnce(t *testing.T) {
	root := tempRoot(t)
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	defer cancel()
	cmd := Command()
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs([]string{"--once"})
	if err := cmd.ExecuteContext(ctx); err != nil {
		t.Fatalf("plugd demo --once: %v\nstdout:\n%s\nstderr:\n%s", err, &out, &errOut)
	}
	checkScenario(t, out.String())
	if !strings.Contains(out.String(), "--once: stopping the example plugins, then plugd.") {
		t.Errorf("output lacks the --once line:\n%s", &out)
	}
	if errOut.Len() > 0 {
		t.Errorf("plugd demo --once wrote to standard error, where only --verbose logs belong:\n%s", &errOut)
	}
	assertNoLeftovers(t, root, out.String())
}

func TestCommandRejectsArguments(t *testing.T) {
	cmd := Command()
	cmd.SetOut(new(bytes.Buffer))
	cmd.SetErr(new(bytes.Buffer))
	cmd.SetArgs([]string{"extra"})
	if err := cmd.Execute(); err == nil {
		t.Fatal("plugd demo extra: no error, want one for the unexpected argument")
	}
}

func TestShortenError(t *testing.T) {
	for _, tc := range []struct {
		in   string
		n    int
		want string
	}{
		{"short", 10, "short"},
		{"connect fpga.sock: dial unix fpga.sock: connect: connection refused", 48, "connect fpga.sock: ...: connection refused"},
		{"no handler for plugin type \"example.com/Unknown\": the manager has none for it", 30, "no handler for plugin type ..."},
	} {
		if got := shortenError(tc.in, tc.n); got != tc.want {
			t.Errorf("shortenError(%q, %d) = %q, want %q", tc.in, tc.n, got, tc.want)
		}
	}
}

func TestFit(t *testing.T) {
	if got, want := fit("\n12345\n123\n", 5), "\n1234\n123\n"; got != want {
		t.Errorf("fit = %q, want %q", got, want)
	}
}

// tempRoot points os.TempDir, where the demo makes its directory, at a fresh
// short directory, so that the test can check nothing is left in it.
func tempRoot(t *testing.T) string {
	t.Helper()
	root := testenv.ShortDir(t, "dt")
	t.Setenv("TMPDIR", root)
	return root
}

// assertNoLeftovers fails if the demo left anything in root, or left the
// directory it printed (which is elsewhere if root was too long for sockets).
func assertNoLeftovers(t *testing.T, root, output string) {
	t.Helper()
	left, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range left {
		t.Errorf("the demo left %s behind in %s", e.Name(), root)
	}
	if m := regexp.MustCompile(`registry directory  (\S+)`).FindStringSubmatch(output); m != nil {
		if _, err := os.Stat(filepath.Dir(m[1])); !os.IsNotExist(err) {
			t.Errorf("the demo's directory %s is still there (stat: %v)", filepath.Dir(m[1]), err)
		}
	}
}

func containsAll(s string, parts ...string) bool {
	for _, p := range parts {
		if !strings.Contains(s, p) {
			return false
		}
	}
	return true
}

// syncBuffer is an output a test can read while the demo writes it, and wait on.
type syncBuffer struct {
	mu      sync.Mutex
	b       bytes.Buffer
	changed chan struct{} // closed, and replaced, by each write
	onWrite func(all string)
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	n, err := b.b.Write(p)
	if b.changed != nil {
		close(b.changed)
		b.changed = nil
	}
	if b.onWrite != nil {
		b.onWrite(b.b.String())
	}
	return n, err
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// waitFor returns the output once it contains want, failing the test if ctx
// ends first.
func (b *syncBuffer) waitFor(t *testing.T, ctx context.Context, want string) string {
	t.Helper()
	for {
		b.mu.Lock()
		s := b.b.String()
		if b.changed == nil {
			b.changed = make(chan struct{})
		}
		changed := b.changed
		b.mu.Unlock()
		if strings.Contains(s, want) {
			return s
		}
		select {
		case <-changed:
		case <-ctx.Done():
			t.Fatalf("the output never contained %q: %v\noutput:\n%s", want, ctx.Err(), s)
		}
	}
}
