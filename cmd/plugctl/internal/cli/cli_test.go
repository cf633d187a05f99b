package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"go.uber.org/goleak"
	"sigs.k8s.io/yaml"

	"github.com/plugd/plugd/api"
	"github.com/plugd/plugd/cmd/internal/version"
	"github.com/plugd/plugd/internal/testenv"
	"github.com/plugd/plugd/plugin"
	"github.com/spf13/cobra"
)

// plugd is the daemon the tests run plugctl against, built once by TestMain.
var plugd string

func TestMain(m *testing.M) { os.Exit(runTests(m)) }

func runTests(m *testing.M) int {
	dir, err := os.MkdirTemp("", "cli-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	if err := testenv.Build(dir, "cmd/plugd"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	plugd = filepath.Join(dir, "plugd")
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	return code
}

// Plugins the tests start. The daemon accepts the first two types and has no
// handler for the third.
const (
	csiID  = "csi.example.com.sock"
	gpuID  = "gpu.example.com.sock"
	nopeID = "nope.example.com.sock"
)

// env is a real plugd, run as a process on a temporary registry directory.
type env struct {
	dir  string // registry directory
	sock string // status API
	stop func() // stops plugd and waits for it; idempotent
}

func startDaemon(t *testing.T) *env {
	t.Helper()
	// Not t.TempDir: its long path would make the sockets' paths too long.
	tmp := testenv.ShortDir(t, "cli")
	e := &env{dir: filepath.Join(tmp, "plugins"), sock: filepath.Join(tmp, "plugd.sock")}
	// Nothing of the machine the tests run on: no kubelet roots, no processes.
	config := fmt.Sprintf(`registryDir: %s
status: {socket: %s}
handlers: [{type: CSIPlugin, handler: accept}, {type: DevicePlugin, handler: accept}]
doctor: {kubeletRoots: [%s], procDir: none}
`, e.dir, e.sock, filepath.Join(tmp, "no-kubelet"))
	path := filepath.Join(tmp, "plugd.yaml")
	if err := os.WriteFile(path, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	logs := &testenv.Buffer{}
	cmd := exec.Command(plugd, "--config", path)
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var runErr error
	go func() {
		defer close(done)
		runErr = cmd.Wait()
	}()
	var once sync.Once
	e.stop = func() {
		once.Do(func() {
			cmd.Process.Signal(syscall.SIGTERM)
			<-done
			if runErr != nil {
				t.Errorf("plugd: %v", runErr)
			}
		})
	}
	t.Cleanup(func() {
		e.stop()
		if t.Failed() {
			t.Logf("plugd's log:\n%s", logs)
		}
	})
	waitReady(t, e.sock, done)
	return e
}

// waitReady waits until plugd has scanned its directory. Run creates the
// socket in its own goroutine, so there is nothing to wait on but retries;
// this is the only place the tests retry.
func waitReady(t *testing.T, sock string, done <-chan struct{}) {
	t.Helper()
	c := &api.Client{Socket: sock}
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(testenv.Timeout)
	for {
		if c.Ready(context.Background()) == nil {
			return
		}
		select {
		case <-tick.C:
		case <-done:
			t.Fatal("plugd stopped before it was ready")
		case <-deadline:
			t.Fatal("plugd was not ready in time")
		}
	}
}

// plugin starts a real plugin (with the SDK) in the registry directory; it
// stops at the end of the test.
func (e *env) plugin(t *testing.T, typ, name string) *plugin.Server {
	t.Helper()
	s, err := plugin.Start(plugin.Config{Dir: e.dir, Type: typ, Name: name, Versions: []string{"v1"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// threePlugins starts a CSI plugin and a device plugin, which plugd
// registers, and one of a type it has no handler for, which it rejects; it
// returns once plugd has done so.
func (e *env) threePlugins(t *testing.T) {
	t.Helper()
	e.plugin(t, "CSIPlugin", "csi.example.com")
	e.plugin(t, "DevicePlugin", "gpu.example.com")
	e.plugin(t, "example.com/Nope", "nope.example.com")
	e.mustRun(t, "wait", "--id", csiID, "--for", "registered")
	e.mustRun(t, "wait", "--id", gpuID, "--for", "registered")
	e.mustRun(t, "wait", "--id", nopeID, "--for", "rejected")
}

// result is what one run of plugctl did.
type result struct {
	stdout, stderr string
	code           int
}

// run runs plugctl against this daemon.
func (e *env) run(args ...string) result {
	return run(append([]string{"--socket", e.sock}, args...)...)
}

func run(args ...string) result {
	var stdout, stderr bytes.Buffer
	code := Run(context.Background(), args, &stdout, &stderr)
	return result{stdout.String(), stderr.String(), code}
}

func (e *env) mustRun(t *testing.T, args ...string) string {
	t.Helper()
	r := e.run(args...)
	if r.code != ExitOK {
		t.Fatalf("plugctl %s: exit code %d, stderr:\n%s", strings.Join(args, " "), r.code, r.stderr)
	}
	return r.stdout
}

func (r result) want(t *testing.T, code int, stderrHas ...string) {
	t.Helper()
	if r.code != code {
		t.Errorf("exit code %d, want %d; stdout:\n%s\nstderr:\n%s", r.code, code, r.stdout, r.stderr)
	}
	for _, s := range stderrHas {
		if !strings.Contains(r.stderr, s) {
			t.Errorf("stderr does not say %q:\n%s", s, r.stderr)
		}
	}
}

func TestList(t *testing.T) {
	e := startDaemon(t)
	e.threePlugins(t)

	t.Run("table", func(t *testing.T) {
		lines := strings.Split(strings.TrimSuffix(e.mustRun(t, "list"), "\n"), "\n")
		if got := strings.Fields(lines[0]); !slices.Equal(got, []string{"ID", "TYPE", "NAME", "STATE", "AGE", "ERROR"}) {
			t.Fatalf("header %q", lines[0])
		}
		want := [][]string{
			{csiID, "CSIPlugin", "csi.example.com", "Registered"},
			{gpuID, "DevicePlugin", "gpu.example.com", "Registered"},
			{nopeID, "example.com/Nope", "nope.example.com", "Rejected"},
		}
		if len(lines) != 1+len(want) {
			t.Fatalf("want a header and %d rows:\n%s", len(want), strings.Join(lines, "\n"))
		}
		for i, w := range want {
			f := strings.Fields(lines[i+1])
			if !slices.Equal(f[:4], w) {
				t.Errorf("row %d is %q, want it to start with %q", i, lines[i+1], w)
			}
			if !regexp.MustCompile(`^\d+[smhd]$`).MatchString(f[4]) {
				t.Errorf("row %d: AGE %q is not like 3s", i, f[4])
			}
		}
		if !strings.HasSuffix(lines[1], "   -") {
			t.Errorf("a registered plugin's ERROR should be -: %q", lines[1])
		}
		if !strings.Contains(lines[3], "no handler for plugin type") {
			t.Errorf("the rejected plugin's ERROR should say why: %q", lines[3])
		}
	})

	t.Run("error cut to fit", func(t *testing.T) {
		t.Setenv("COLUMNS", "110")
		out := e.mustRun(t, "list")
		for line := range strings.Lines(out) {
			if n := utf8.RuneCountInString(strings.TrimSuffix(line, "\n")); n > 110 {
				t.Errorf("line of %d characters is wider than $COLUMNS:\n%s", n, line)
			}
		}
		if !strings.Contains(out, "   no handler for plugin type \"…\n") {
			t.Errorf("the long error should be cut to fit, with an ellipsis:\n%s", out)
		}
	})

	t.Run("wide", func(t *testing.T) {
		lines := strings.Split(e.mustRun(t, "list", "-o", "wide"), "\n")
		for _, col := range []string{"ENDPOINT", "VERSIONS", "ATTEMPTS", "NEXT RETRY", "NEWEST"} {
			if !strings.Contains(lines[0], col) {
				t.Errorf("wide header lacks %s: %q", col, lines[0])
			}
		}
		f := strings.Fields(lines[1])
		if want := []string{csiID, "CSIPlugin", "csi.example.com", "Registered"}; !slices.Equal(f[:4], want) {
			t.Errorf("row %q", lines[1])
		}
		if want := []string{filepath.Join(e.dir, csiID), "v1", "1", "-", "yes", "-"}; !slices.Equal(f[5:], want) {
			t.Errorf("wide columns of %q are %q, want %q", lines[1], f[5:], want)
		}
		if !strings.Contains(lines[3], `no handler for plugin type "example.com/Nope": the manager has none for it`) {
			t.Errorf("wide should print the whole error: %q", lines[3])
		}
	})

	t.Run("json", func(t *testing.T) {
		var list api.PluginList
		if err := json.Unmarshal([]byte(e.mustRun(t, "list", "-o", "json")), &list); err != nil {
			t.Fatal(err)
		}
		checkList(t, list, csiID, gpuID, nopeID)
		if p := list.Plugins[2]; p.State != "Rejected" || p.Reason != "no_handler" {
			t.Errorf("rejected plugin: %+v", p)
		}
	})

	t.Run("yaml", func(t *testing.T) {
		var list api.PluginList
		if err := yaml.UnmarshalStrict([]byte(e.mustRun(t, "list", "-o", "yaml")), &list); err != nil {
			t.Fatal(err)
		}
		checkList(t, list, csiID, gpuID, nopeID)
	})

	t.Run("filters", func(t *testing.T) {
		for _, tc := range []struct {
			args []string
			want []string
		}{
			{[]string{"--type", "DevicePlugin"}, []string{gpuID}},
			{[]string{"--name", "csi.example.com"}, []string{csiID}},
			{[]string{"--state", "Registered"}, []string{csiID, gpuID}},
			{[]string{"--state", "rejected"}, []string{nopeID}}, // any case
			{[]string{"--type", "CSIPlugin", "--state", "Rejected"}, nil},
		} {
			var list api.PluginList
			if err := json.Unmarshal([]byte(e.mustRun(t, append([]string{"list", "-o", "json"}, tc.args...)...)), &list); err != nil {
				t.Fatal(err)
			}
			checkList(t, list, tc.want...)
		}
		r := e.run("list", "--type", "CSIPlugin", "--state", "Rejected")
		r.want(t, ExitOK, "no plugins match --type CSIPlugin --state Rejected", "plugd watches "+e.dir)
		if r.stdout != "" {
			t.Errorf("nothing matches, yet stdout is %q", r.stdout)
		}
	})

	t.Run("bad values", func(t *testing.T) {
		e.run("list", "-o", "xml").want(t, ExitUsage, `--output "xml" must be one of table, wide, json, yaml`, "Run 'plugctl list --help' for usage.")
		e.run("list", "--state", "Happy").want(t, ExitUsage, `--state "Happy" must be one of Pending`)
	})
}

func checkList(t *testing.T, list api.PluginList, ids ...string) {
	t.Helper()
	var got []string
	for _, p := range list.Plugins {
		got = append(got, p.ID)
		if p.State == "" || p.Socket == "" || p.Discovered.IsZero() {
			t.Errorf("plugin lacks fields: %+v", p)
		}
	}
	if !slices.Equal(got, ids) {
		t.Errorf("plugins %q, want %q", got, ids)
	}
}

func TestListEmpty(t *testing.T) {
	e := startDaemon(t)
	r := e.run("list")
	r.want(t, ExitOK)
	if r.stdout != "" || r.stderr != "no plugins; plugd watches "+e.dir+"\n" {
		t.Errorf("stdout %q, stderr %q", r.stdout, r.stderr)
	}
	// Machine output stays parseable, with an empty list rather than null.
	if out := e.mustRun(t, "list", "-o", "json"); strings.Join(strings.Fields(out), "") != `{"plugins":[]}` {
		t.Errorf("json of no plugins: %q", out)
	}
}

func TestGet(t *testing.T) {
	e := startDaemon(t)
	e.threePlugins(t)

	var p api.Plugin
	if err := yaml.UnmarshalStrict([]byte(e.mustRun(t, "get", csiID)), &p); err != nil {
		t.Fatal(err)
	}
	if p.ID != csiID || p.Type != "CSIPlugin" || p.State != "Registered" || p.RegisteredSince.IsZero() {
		t.Errorf("get (yaml): %+v", p)
	}
	p = api.Plugin{}
	if err := json.Unmarshal([]byte(e.mustRun(t, "get", nopeID, "-o", "json")), &p); err != nil {
		t.Fatal(err)
	}
	if p.ID != nopeID || p.State != "Rejected" || !strings.Contains(p.LastError, "no handler") {
		t.Errorf("get (json): %+v", p)
	}

	e.run("get", "nothing.sock").want(t, ExitError, `no plugin with ID "nothing.sock"`, "run 'plugctl list' to see the IDs")
	// The name, or the socket's full path, is what people type by mistake.
	e.run("get", "csi.example.com").want(t, ExitError, "did you mean "+csiID+"?")
	e.run("get", filepath.Join(e.dir, gpuID)).want(t, ExitError, "did you mean "+gpuID+"?")
	e.run("get").want(t, ExitUsage, "get needs the ID of a plugin", "Run 'plugctl get --help' for usage.")
	e.run("get", "-o", "table", csiID).want(t, ExitUsage, `--output "table" must be one of yaml, json`)
}

func TestCompletion(t *testing.T) {
	e := startDaemon(t)
	e.threePlugins(t)

	out := e.mustRun(t, "__complete", "get", "")
	for _, want := range []string{csiID + "\tCSIPlugin csi.example.com Registered", gpuID, nopeID, ":4"} {
		if !strings.Contains(out, want) {
			t.Errorf("completions of get lack %q:\n%s", want, out)
		}
	}
	if out := e.mustRun(t, "__complete", "get", "gpu"); strings.Contains(out, csiID) || !strings.Contains(out, gpuID) {
		t.Errorf("completions of get gpu:\n%s", out)
	}
	if out := e.mustRun(t, "__complete", "wait", "--type", ""); !strings.Contains(out, "DevicePlugin\n") {
		t.Errorf("completions of wait --type:\n%s", out)
	}
	// Without plugd, there is nothing to offer, and no error in the shell.
	r := run("--socket", filepath.Join(e.dir, "none.sock"), "__complete", "get", "")
	r.want(t, ExitOK)
	if r.stdout != ":4\n" {
		t.Errorf("completions without plugd: %q", r.stdout)
	}
	if out := e.mustRun(t, "completion", "bash"); !strings.Contains(out, "bash completion") {
		t.Errorf("completion bash printed no script:\n%.200s", out)
	}
}

// background is plugctl running in a goroutine, its output read line by line
// through pipes as it is written.
type background struct {
	cancel         context.CancelFunc
	stdout, stderr chan string // lines; closed when plugctl ends
	done           chan int    // the exit code
	once           sync.Once
	code           int
}

func (e *env) background(t *testing.T, args ...string) *background {
	ctx, cancel := context.WithCancel(context.Background())
	outR, outW := io.Pipe()
	errR, errW := io.Pipe()
	b := &background{cancel: cancel, stdout: lines(outR), stderr: lines(errR), done: make(chan int, 1)}
	go func() {
		code := Run(ctx, append([]string{"--socket", e.sock}, args...), outW, errW)
		outW.Close()
		errW.Close()
		b.done <- code
	}()
	t.Cleanup(func() { b.interrupt(t) })
	return b
}

// lines reads r line by line into a channel, until r ends.
func lines(r io.Reader) chan string {
	c := make(chan string)
	go func() {
		defer close(c)
		s := bufio.NewScanner(r)
		for s.Scan() {
			c <- s.Text()
		}
	}()
	return c
}

// waitLine reads lines from c until one matches re, and returns the lines
// read, the match last.
func waitLine(t *testing.T, c <-chan string, re string) []string {
	t.Helper()
	rx := regexp.MustCompile(re)
	var seen []string
	deadline := time.After(testenv.Timeout)
	for {
		select {
		case line, ok := <-c:
			if !ok {
				t.Fatalf("plugctl ended without a line matching %q; it printed:\n%s", re, strings.Join(seen, "\n"))
			}
			seen = append(seen, line)
			if rx.MatchString(line) {
				return seen
			}
		case <-deadline:
			t.Fatalf("no line matching %q; plugctl printed:\n%s", re, strings.Join(seen, "\n"))
		}
	}
}

// result waits for plugctl to end by itself and returns its exit code and
// the rest of its output.
func (b *background) result(t *testing.T) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut []string
	// Read both to the end, or plugctl would block writing.
	deadline := time.After(testenv.Timeout)
	for b.stdout != nil || b.stderr != nil {
		select {
		case l, ok := <-b.stdout:
			if !ok {
				b.stdout = nil
				continue
			}
			out = append(out, l)
		case l, ok := <-b.stderr:
			if !ok {
				b.stderr = nil
				continue
			}
			errOut = append(errOut, l)
		case <-deadline:
			b.cancel()
			t.Fatalf("plugctl did not end; stdout:\n%s\nstderr:\n%s", strings.Join(out, "\n"), strings.Join(errOut, "\n"))
		}
	}
	b.once.Do(func() { b.code = <-b.done })
	return b.code, strings.Join(out, "\n"), strings.Join(errOut, "\n")
}

// interrupt does what Ctrl-C does, and returns how plugctl ended.
func (b *background) interrupt(t *testing.T) (code int, stdout, stderr string) {
	b.cancel()
	return b.result(t)
}

// eventRx matches a text line of watch.
func eventRx(event, typ, name, id, state string) string {
	return `^\d\d:\d\d:\d\d\.\d{3}  ` + event + ` +  ` + regexp.QuoteMeta(typ) + `  ` + regexp.QuoteMeta(name) + `  ` +
		regexp.QuoteMeta(id) + `  ` + state
}

func TestWatch(t *testing.T) {
	e := startDaemon(t)
	// --replay covers the events between starting watch and its subscription.
	b := e.background(t, "watch", "--replay", "100")
	e.plugin(t, "CSIPlugin", "csi.example.com")
	seen := waitLine(t, b.stdout, eventRx("Registered", "CSIPlugin", "csi.example.com", csiID, "Registered")+"$")
	if !slices.ContainsFunc(seen, regexp.MustCompile(eventRx("Discovered", "-", "-", csiID, "Pending")).MatchString) {
		t.Errorf("no Discovered line before Registered:\n%s", strings.Join(seen, "\n"))
	}
	e.plugin(t, "example.com/Nope", "nope.example.com")
	waitLine(t, b.stdout, eventRx("Rejected", "example.com/Nope", "nope.example.com", nopeID, "Rejected")+
		`  error \(no_handler\): no handler for plugin type "example.com/Nope"`)

	if code, _, stderr := b.interrupt(t); code != ExitOK || stderr != "" {
		t.Errorf("after Ctrl-C: exit code %d, stderr %q; want 0 and nothing", code, stderr)
	}
}

func TestWatchJSON(t *testing.T) {
	e := startDaemon(t)
	b := e.background(t, "watch", "--replay", "100", "-o", "json")
	e.plugin(t, "DevicePlugin", "gpu.example.com")
	for _, line := range waitLine(t, b.stdout, `"type":"Registered"`) {
		var ev api.Event
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		if ev.Seq == 0 || ev.Time.IsZero() || ev.Plugin.ID != gpuID {
			t.Errorf("event %+v", ev)
		}
	}
	if code, _, _ := b.interrupt(t); code != ExitOK {
		t.Errorf("exit code %d after Ctrl-C", code)
	}
}

func TestWatchEndsWithPlugd(t *testing.T) {
	e := startDaemon(t)
	b := e.background(t, "watch", "--replay", "100")
	e.plugin(t, "CSIPlugin", "csi.example.com")
	waitLine(t, b.stdout, "Registered") // watch is subscribed
	e.stop()
	code, _, stderr := b.result(t)
	if code != ExitError || !strings.Contains(stderr, "plugctl: plugd at "+e.sock+" closed the event stream; did it stop?") {
		t.Errorf("exit code %d, stderr %q", code, stderr)
	}
}

func TestWaitRegisteredLater(t *testing.T) {
	e := startDaemon(t)
	b := e.background(t, "wait", "--type", "CSIPlugin", "--name", "csi.example.com", "--for", "registered")
	// Only start the plugin once wait has looked and found nothing.
	waitLine(t, b.stderr, regexp.QuoteMeta("waiting up to 30s for a plugin with type=CSIPlugin name=csi.example.com to be Registered; now no plugin matches"))
	e.plugin(t, "CSIPlugin", "csi.example.com")
	if code, stdout, stderr := b.result(t); code != ExitOK || stdout != csiID+" is Registered" {
		t.Errorf("exit code %d, stdout %q, stderr %q", code, stdout, stderr)
	}
}

// Issue 13, item 6: wait (a readiness probe) works when plugd has no event
// stream left for it: it asks for the list instead.
func TestWaitWithoutAStream(t *testing.T) {
	e := startDaemon(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := &api.Client{Socket: e.sock}
	for {
		s, err := c.Events(ctx, 0)
		if err != nil {
			t.Logf("plugd has no stream left for this client: %v", err)
			break
		}
		defer s.Close()
	}
	b := e.background(t, "wait", "--type", "CSIPlugin", "--name", "csi.example.com", "--for", "registered")
	waitLine(t, b.stderr, "plugd has no event stream free .*this client .* has 16 event streams open.*; asking every 250ms instead")
	waitLine(t, b.stderr, regexp.QuoteMeta("waiting up to 30s for a plugin with type=CSIPlugin name=csi.example.com to be Registered; now no plugin matches"))
	e.plugin(t, "CSIPlugin", "csi.example.com")
	if code, stdout, stderr := b.result(t); code != ExitOK || stdout != csiID+" is Registered" {
		t.Errorf("exit code %d, stdout %q, stderr %q", code, stdout, stderr)
	}
}

// Issue 25, item 7: watch, like wait, works when plugd has no event stream
// left for it: it says so, asks for the list every second, and prints the
// changes as events. Before, it exited 1 on plugd's 429.
func TestWatchWithoutAStream(t *testing.T) {
	e := startDaemon(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := &api.Client{Socket: e.sock}
	for {
		s, err := c.Events(ctx, 0)
		if err != nil {
			t.Logf("plugd has no stream left for this client: %v", err)
			break
		}
		defer s.Close()
	}
	b := e.background(t, "watch")
	waitLine(t, b.stderr, "plugd has no event stream free .*this client .* has 16 event streams open.*; asking for the list every 1s instead")
	waitLine(t, b.stderr, "plugd lists 0 plugins now; their changes follow")
	p := e.plugin(t, "CSIPlugin", "csi.example.com")
	seen := waitLine(t, b.stdout, eventRx("Registered", "CSIPlugin", "csi.example.com", csiID, "Registered")+"$")
	if !slices.ContainsFunc(seen, regexp.MustCompile(eventRx("Discovered", "CSIPlugin", "csi.example.com", csiID, `\w+`)).MatchString) {
		t.Errorf("no Discovered line before Registered:\n%s", strings.Join(seen, "\n"))
	}
	p.Close()
	waitLine(t, b.stdout, eventRx("Removed", "CSIPlugin", "csi.example.com", csiID, "-"))
	if code, _, _ := b.interrupt(t); code != ExitOK {
		t.Errorf("exit code %d after Ctrl-C, want 0", code)
	}
}

// listEvents makes, of two lists, the events plugd would have sent.
func TestListEvents(t *testing.T) {
	p := func(id, state string, attempts int) api.Plugin {
		return api.Plugin{ID: id, State: state, Attempts: attempts}
	}
	list := func(ps ...api.Plugin) map[string]api.Plugin {
		m := map[string]api.Plugin{}
		for _, p := range ps {
			m[p.ID] = p
		}
		return m
	}
	before := list(p("a", "Registered", 1), p("b", "Failed", 1), p("c", "Unhealthy", 1), p("d", "Registered", 1), p("gone", "Stale", 3), p("same", "Registered", 1))
	now := list(p("a", "Unhealthy", 1), p("b", "Failed", 2), p("c", "Registered", 1), p("d", "Failed", 2), p("new", "Rejected", 1), p("same", "Registered", 1))
	var got []string
	for _, ev := range listEvents(before, now, time.Now()) {
		if ev.Seq != 0 {
			t.Errorf("event %+v has a Seq: it is not plugd's", ev)
		}
		got = append(got, ev.Type+" "+ev.Plugin.ID)
	}
	want := []string{"Unhealthy a", "Failed b", "Healthy c", "Deregistered d", "Failed d", "Discovered new", "Rejected new", "Removed gone"}
	if !slices.Equal(got, want) {
		t.Errorf("events %q, want %q", got, want)
	}
}

func TestWaitRejected(t *testing.T) {
	e := startDaemon(t)
	e.plugin(t, "example.com/Nope", "nope.example.com")
	if out := e.mustRun(t, "wait", "--type", "example.com/Nope", "--for", "rejected"); out != nopeID+" is Rejected\n" {
		t.Errorf("stdout %q", out)
	}
}

func TestWaitGone(t *testing.T) {
	e := startDaemon(t)
	p := e.plugin(t, "CSIPlugin", "csi.example.com")
	e.mustRun(t, "wait", "--id", csiID, "--for", "present")
	b := e.background(t, "wait", "--id", csiID, "--for", "gone")
	waitLine(t, b.stderr, "waiting up to 30s for no plugin with id="+regexp.QuoteMeta(csiID)+" to be left; now "+regexp.QuoteMeta(csiID)+" is ")
	p.Close()
	if code, stdout, stderr := b.result(t); code != ExitOK || stdout != "no plugin with id="+csiID+" is left" {
		t.Errorf("exit code %d, stdout %q, stderr %q", code, stdout, stderr)
	}
}

func TestWaitTimeout(t *testing.T) {
	e := startDaemon(t)
	e.run("wait", "--name", "nothing.example.com", "--for", "registered", "--timeout", "300ms").want(t, ExitTimeout,
		"plugctl: timed out after 300ms waiting for a plugin with name=nothing.example.com to be Registered; last seen: no plugin matches")

	e.plugin(t, "example.com/Nope", "nope.example.com")
	e.mustRun(t, "wait", "--id", nopeID, "--for", "rejected")
	// The message says what the plugin is instead, and why.
	e.run("wait", "--type", "example.com/Nope", "--for", "registered", "--timeout", "300ms").want(t, ExitTimeout,
		"waiting for a plugin with type=example.com/Nope to be Registered; last seen: "+nopeID+` is Rejected, error (no_handler): no handler for plugin type "example.com/Nope"`)
}

func TestUsageErrors(t *testing.T) {
	sock := filepath.Join(os.TempDir(), "plugctl-test-none.sock")
	for _, tc := range []struct {
		args []string
		cmd  string // in the hint
		says string
	}{
		{[]string{"wait", "--for", "registered"}, "plugctl wait", "wait needs at least one of --type, --name and --id"},
		{[]string{"wait", "--name", "x"}, "plugctl wait", "wait needs --for: one of registered, rejected, failed, stale, unhealthy, answering, not-answering, gone, present"},
		{[]string{"wait", "--name", "x", "--for", "happy"}, "plugctl wait", `--for "happy" must be one of`},
		{[]string{"wait", "--name", "x", "--for", "gone", "--timeout", "-1s"}, "plugctl wait", "--timeout -1s must be 0"},
		{[]string{"wait", "--name", "x", "--for", "gone", "--timeout", "soon"}, "plugctl wait", `invalid argument "soon" for "--timeout"`},
		{[]string{"list", "extra"}, "plugctl list", `list takes no arguments, but got ["extra"]`},
		{[]string{"list", "--bogus"}, "plugctl list", "unknown flag: --bogus"},
		{[]string{"get", "a", "b"}, "plugctl get", "get takes one plugin ID, but got 2"},
		{[]string{"watch", "--replay", "-1"}, "plugctl watch", "--replay -1 must be 0 or more"},
		{[]string{"watch", "-o", "yaml"}, "plugctl watch", `--output "yaml" must be one of text, json`},
		{[]string{"lst"}, "plugctl", `unknown command "lst" for "plugctl"`},
		{[]string{"--timeout", "0s", "list"}, "plugctl list", "--timeout 0s must be positive"},
		{[]string{"--address", "http://127.0.0.1:1", "list"}, "plugctl list", "--socket and --address both say where plugd is"},
	} {
		r := run(append([]string{"--socket", sock}, tc.args...)...)
		r.want(t, ExitUsage, "plugctl: "+tc.says, "Run '"+tc.cmd+" --help' for usage.\n")
		if strings.Contains(r.stderr, "Usage:") || r.stdout != "" {
			t.Errorf("plugctl %q: a usage error should print a hint, not the usage; stdout %q, stderr %q", tc.args, r.stdout, r.stderr)
		}
	}
}

// Issue 13, item 9: plugctl does not trust the server. An endless answer
// and an endless event end with errors that say so; text meant to drive the
// terminal (an escape sequence in an error) reaches it escaped.
func TestHostileDaemon(t *testing.T) {
	const evil = "\x1b]0;owned\x07\x1b[2J"
	plugin := api.Plugin{ID: "x.sock", Type: "T", Name: "x", State: "Failed", Reason: "dial", LastError: "refused " + evil}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fill := func(prefix string) {
			w.WriteHeader(http.StatusOK)
			io.WriteString(w, prefix)
			chunk := bytes.Repeat([]byte("A"), 64<<10)
			for range 1024 { // 64 MiB
				if _, err := w.Write(chunk); err != nil {
					return
				}
			}
		}
		switch {
		case r.URL.Path == "/v1/plugins" && r.URL.Query().Get("name") == "endless":
			fill(`{"plugins": [{"id": "`)
		case r.URL.Path == "/v1/plugins":
			json.NewEncoder(w).Encode(api.PluginList{Plugins: []api.Plugin{plugin}})
		case r.URL.Path == "/v1/events":
			json.NewEncoder(w).Encode(api.Event{Seq: 1, Type: "Failed", Plugin: plugin})
		default:
			w.WriteHeader(http.StatusNotFound)
		}
	}))
	defer srv.Close()
	endlessEvents := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		http.NewResponseController(w).Flush()
		chunk := bytes.Repeat([]byte("A"), 64<<10)
		for range 1024 {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	}))
	defer endlessEvents.Close()

	// Reading 32 MiB may take longer than the default --timeout (10s)
	// under -race on 2 busy cores: the bound under test is the size.
	r := run("--address", srv.URL, "--timeout", (3 * testenv.Timeout).String(), "list", "--name", "endless")
	r.want(t, ExitError, "larger than 32 MiB")
	r = run("--address", endlessEvents.URL, "watch")
	r.want(t, ExitError, "longer than 1024 KiB")
	r = run("--address", srv.URL, "watch")
	r.want(t, ExitError, "closed the event stream")
	if !strings.Contains(r.stdout, "refused ") || strings.ContainsAny(r.stdout, "\x1b\x07") {
		t.Errorf("watch printed the event unescaped, or not at all: %q", r.stdout)
	}
	r = run("--address", srv.URL, "wait", "--name", "x", "--for", "registered")
	r.want(t, ExitError, "x.sock is Failed, error (dial): refused ")
	if strings.ContainsAny(r.stderr, "\x1b\x07") {
		t.Errorf("wait printed the error unescaped: %q", r.stderr)
	}
}

func TestUnreachable(t *testing.T) {
	tmp := testenv.ShortDir(t, "cli")
	sock := filepath.Join(tmp, "plugd.sock")
	for _, args := range [][]string{
		{"list"},
		{"get", csiID},
		{"watch"},
		{"version"},
		// wait gives up at once rather than after its timeout.
		{"wait", "--name", "csi.example.com", "--for", "registered", "--timeout", "1h"},
	} {
		r := run(append([]string{"--socket", sock}, args...)...)
		r.want(t, ExitError, "plugctl: cannot reach plugd at "+sock, "is plugd running?")
	}
	if r := run("--socket", sock, "version"); !strings.HasPrefix(r.stdout, version.Line("plugctl")+"\n") {
		t.Errorf("version without plugd should still print plugctl's: %q", r.stdout)
	}
}

func TestVersion(t *testing.T) {
	e := startDaemon(t)
	want := version.Line("plugctl") + "\n" + version.Line("plugd") + " at " + e.sock + ", watching " + e.dir + "\n"
	if out := e.mustRun(t, "version"); out != want {
		t.Errorf("version:\n%s\nwant:\n%s", out, want)
	}
}

func TestEnvironment(t *testing.T) {
	e := startDaemon(t)
	t.Setenv(envSocket, e.sock)
	t.Setenv(envAddress, "")
	if r := run("version"); r.code != ExitOK {
		t.Errorf("$%s is not used: %+v", envSocket, r)
	}
	// $PLUGD_ADDRESS wins over $PLUGD_SOCKET, and a flag over both.
	t.Setenv(envAddress, "http://127.0.0.1:1")
	run("version").want(t, ExitError, "cannot reach plugd at http://127.0.0.1:1")
	if r := run("--socket", e.sock, "version"); r.code != ExitOK {
		t.Errorf("--socket does not win over $%s: %+v", envAddress, r)
	}
}

// plugctl doctor prints plugd's findings and says by its exit code whether
// any is a warning or worse; --min-severity and -o json shape the output.
func TestDoctor(t *testing.T) {
	e := startDaemon(t)
	r := e.run("doctor")
	r.want(t, ExitOK)
	if !strings.Contains(r.stdout, "plugd found nothing wrong") {
		t.Errorf("doctor on a clean node:\n%s", r.stdout)
	}
	e.plugin(t, "CSIPlugin", "csi.example.com") // offers "v1", which is no CSI version
	e.mustRun(t, "wait", "--id", csiID, "--for", "registered")
	r = e.run("doctor")
	r.want(t, ExitFindings, "found 1 error")
	for _, s := range []string{"ERROR  versions-refused  CSIPlugin csi.example.com  " + filepath.Join(e.dir, csiID), "  - versions: [v1]", "  remedy: ", "\n1 error\n"} {
		if !strings.Contains(r.stdout, s) {
			t.Errorf("doctor does not print %q:\n%s", s, r.stdout)
		}
	}
	r = e.run("doctor", "-o", "json", "--min-severity", "error")
	var list api.FindingList
	if err := json.Unmarshal([]byte(r.stdout), &list); err != nil || len(list.Findings) != 1 || list.Findings[0].Check != "versions-refused" {
		t.Errorf("doctor -o json: %v\n%s", err, r.stdout)
	}
	e.run("doctor", "--min-severity", "loud").want(t, ExitUsage, `--min-severity "loud" must be one of info, warning, error`)
}

// Issue 33, item 12: --min-severity decides what is found, for the exit
// code too: with only a warning found, --min-severity error prints that
// nothing is at error or above (not an empty list alone, not "nothing
// wrong") and exits 0; JSON is an empty list.
func TestDoctorMinSeverity(t *testing.T) {
	e := startDaemon(t)
	testenv.DeadSocket(t, filepath.Join(e.dir, "dead.sock")) // a stale socket: a warning
	e.mustRun(t, "wait", "--id", "dead.sock", "--for", "stale")
	e.run("doctor").want(t, ExitFindings, "found 1 warning")
	r := e.run("doctor", "--min-severity", "error")
	r.want(t, ExitOK)
	if !strings.Contains(r.stdout, "plugd found nothing at error or above (below it: 1 warning; --min-severity info shows them)") {
		t.Errorf("doctor --min-severity error with a warning:\n%s", r.stdout)
	}
	r = e.run("doctor", "--min-severity", "error", "-o", "json")
	r.want(t, ExitOK)
	var list api.FindingList
	if err := json.Unmarshal([]byte(r.stdout), &list); err != nil || list.Findings == nil || len(list.Findings) != 0 {
		t.Errorf("doctor --min-severity error -o json: %v\n%s", err, r.stdout)
	}
}

// With plugd connected to Kubernetes, the table has a KUBELET column; -o
// wide gives its reason. Without, the table is as it always was.
func TestKubeletColumn(t *testing.T) {
	now := time.Now()
	plain := []api.Plugin{{ID: "a.sock", Type: "CSIPlugin", Name: "a", State: "Answering"}}
	if h := pluginTable(plain, false, now).Header; slices.Contains(h, "KUBELET") {
		t.Errorf("header %q without Kubernetes", h)
	}
	kube := []api.Plugin{
		{ID: "a.sock", Type: "CSIPlugin", Name: "a", State: "Answering", Kubelet: &api.KubeletView{State: "NotRegistered", Reason: "NotInCSINode"}},
		{ID: "b.sock", State: "Pending"},
	}
	var b strings.Builder
	pluginTable(kube, false, now).Write(&b, 0)
	if lines := strings.Split(b.String(), "\n"); !strings.HasPrefix(lines[0], "ID       TYPE        NAME   STATE       KUBELET         AGE") ||
		!strings.Contains(lines[1], "Answering   NotRegistered") || !strings.Contains(lines[2], "Pending     -") {
		t.Errorf("table:\n%s", b.String())
	}
	b.Reset()
	pluginTable(kube, true, now).Write(&b, 0)
	if !strings.Contains(b.String(), "NotRegistered(NotInCSINode)") {
		t.Errorf("wide table:\n%s", b.String())
	}
}

// plugctl cluster reads the API server's address as kubectl does; the view
// and its table are package fleet's, tested there and in test/kube.
func TestClusterNoAPIServer(t *testing.T) {
	run("cluster", "--kubeconfig", "/nonexistent/kubeconfig").want(t, ExitError, "cannot find the Kubernetes API server")
}

// Issue 33, item 12: no line of any command's help starts with a stray
// space; indented blocks (two spaces or more) are fine.
func TestHelpHasNoStraySpace(t *testing.T) {
	a := &app{stdout: io.Discard, stderr: io.Discard, getenv: func(string) string { return "" }}
	var check func(cmd *cobra.Command)
	check = func(cmd *cobra.Command) {
		for _, text := range []string{cmd.Short, cmd.Long, cmd.Example} {
			for _, line := range strings.Split(text, "\n") {
				if strings.HasPrefix(line, " ") && !strings.HasPrefix(line, "  ") {
					t.Errorf("%s: a line of its help starts with a stray space: %q", cmd.CommandPath(), line)
				}
			}
		}
		for _, sub := range cmd.Commands() {
			check(sub)
		}
	}
	check(a.rootCommand())
}

// A plugin's startup taints have a TAINT column: the state, the holder of
// one plugd leaves; -o wide adds the taint, since when, and the re-adds.
func TestTaintColumn(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	ps := []api.Plugin{
		{ID: "a.sock", Type: "CSIPlugin", Name: "a", State: "Registered", Taints: []api.TaintView{
			{Taint: "a.example.com/not-ready:NoExecute", State: api.TaintRemoved, Since: now.Add(-5 * time.Minute), ReRemovals: 2, ReaddedBy: "node-manager"}}},
		{ID: "b.sock", Type: "CSIPlugin", Name: "b", State: "Registered", Taints: []api.TaintView{
			{Taint: "b.example.com/not-ready:NoSchedule", State: api.TaintHeld, Holder: "node-manager", Since: now.Add(-time.Minute)}}},
		{ID: "c.sock", State: "Pending"},
	}
	if h := pluginTable([]api.Plugin{{ID: "c.sock"}}, false, now).Header; slices.Contains(h, "TAINT") {
		t.Errorf("header %q without taints", h)
	}
	var b strings.Builder
	pluginTable(ps, false, now).Write(&b, 0)
	lines := strings.Split(b.String(), "\n")
	if !strings.Contains(lines[0], "STATE        TAINT") || !strings.Contains(lines[1], "Registered   Removed ") ||
		!strings.Contains(lines[2], "Registered   Held by node-manager") || !strings.Contains(lines[3], "Pending      -") {
		t.Errorf("table:\n%s", b.String())
	}
	b.Reset()
	pluginTable(ps, true, now).Write(&b, 0)
	for _, want := range []string{"a.example.com/not-ready:NoExecute Removed 5m ago, removed again 2 times (last re-added by node-manager)",
		"b.example.com/not-ready:NoSchedule Held by node-manager 1m ago"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("wide table lacks %q:\n%s", want, b.String())
		}
	}
}
