// Package e2e runs plugd, plugctl and the example plugin as real processes, as
// an operator would, and checks what they say over the status API and the CLI.
package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/plugd/plugd/api"
	"github.com/plugd/plugd/internal/testenv"
)

// bin holds the binaries built once for the whole run.
var bin string

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "e2e-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	bin = dir
	if err := testenv.Build(dir, "cmd/plugd", "cmd/plugctl", "examples/plugin"); err != nil {
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

// proc is a running binary whose output is kept.
type proc struct {
	cmd  *exec.Cmd
	out  *testenv.Buffer
	done chan struct{}
	err  error
}

// start runs a binary in the background; the test's end kills it if it is
// still running.
func start(t *testing.T, name string, args ...string) *proc {
	t.Helper()
	return startCmd(t, exec.Command(filepath.Join(bin, name), args...))
}

// startCmd is start for a command set up by the caller.
func startCmd(t *testing.T, cmd *exec.Cmd) *proc {
	t.Helper()
	name := filepath.Base(cmd.Path)
	p := &proc{cmd: cmd, out: &testenv.Buffer{}, done: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			p.cmd.Process.Kill()
			<-p.done
			t.Logf("%s was still running at the end; its output:\n%s", name, p.out)
		}
	})
	return p
}

// stop sends sig and waits for the process to exit, returning its exit code.
func (p *proc) stop(t *testing.T, sig os.Signal) int {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	return p.wait(t)
}

func (p *proc) wait(t *testing.T) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(testenv.Timeout):
		t.Fatalf("%s did not exit; output:\n%s", p.cmd.Path, p.out)
	}
	var ee *exec.ExitError
	if errors.As(p.err, &ee) {
		return ee.ExitCode()
	}
	if p.err != nil {
		t.Fatal(p.err)
	}
	return 0
}

// plugctl runs the CLI to completion and returns its output and exit code.
func plugctl(t *testing.T, socket string, args ...string) (string, int) {
	t.Helper()
	out, code, err := runPlugctl(socket, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out, code
}

// runPlugctl is plugctl without the test, for use from another goroutine.
func runPlugctl(socket string, args ...string) (string, int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "plugctl"), append([]string{"--socket", socket}, args...)...)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		return string(out), ee.ExitCode(), nil
	case err != nil:
		return string(out), 0, fmt.Errorf("plugctl %q: %w", args, err)
	}
	return string(out), 0, nil
}

// node is a plugd running on its own directories.
type node struct {
	dir, reg, socket string
	plugd            *proc
	client           *api.Client
}

// startPlugd writes config (with the registry dir and socket filled in) and
// starts plugd on it, waiting until it is ready.
func startPlugd(t *testing.T, config string) *node {
	t.Helper()
	n := launchPlugd(t, config, nil)
	n.waitReady(t, 10*time.Millisecond)
	return n
}

// launchPlugd starts plugd on a fresh directory; prepare, if set, fills the
// registry directory first.
func launchPlugd(t *testing.T, config string, prepare func(reg string)) *node {
	t.Helper()
	n, args := newNode(t, config, prepare)
	n.plugd = start(t, "plugd", args...)
	return n
}

// newNode is launchPlugd without the start: the node, with its configuration
// written, and plugd's arguments.
func newNode(t *testing.T, config string, prepare func(reg string)) (*node, []string) {
	t.Helper()
	dir := testenv.ShortDir(t, "e2e")
	n := &node{dir: dir, reg: filepath.Join(dir, "reg"), socket: filepath.Join(dir, "plugd.sock")}
	if prepare != nil {
		prepare(n.reg)
	}
	cfg := fmt.Sprintf("registryDir: %s\nstatus:\n  socket: %s\n%s", n.reg, n.socket, config)
	path := filepath.Join(dir, "plugd.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	n.client = &api.Client{Socket: n.socket}
	return n, []string{"--config", path, "--backoff-initial", "50ms"}
}

// waitReady asks /readyz every poll until plugd is ready, and returns how
// many times it answered "not ready" first. Start-up is the one wait that has
// no event to wait on: plugd's socket does not exist yet.
func (n *node) waitReady(t *testing.T, poll time.Duration) (notReady int) {
	t.Helper()
	deadline := time.Now().Add(testenv.Timeout)
	for {
		err := n.client.Ready(context.Background())
		switch {
		case err == nil:
			return notReady
		case errors.Is(err, api.ErrNotReady):
			notReady++
		}
		select {
		case <-n.plugd.done:
			t.Fatalf("plugd exited at start: %v\n%s", n.plugd.err, n.plugd.out)
		case <-time.After(poll):
		}
		if time.Now().After(deadline) {
			t.Fatalf("plugd not ready: %v\n%s", err, n.plugd.out)
		}
	}
}

// get fetches a status API path and returns status code and body.
func (n *node) get(t *testing.T, path string) (int, string) {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", n.socket)
		},
	}}
	resp, err := hc.Get("http://plugd" + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func (n *node) plugin(t *testing.T, args ...string) *proc {
	t.Helper()
	return start(t, "plugin", append([]string{"-dir", n.reg}, args...)...)
}

func TestPlugdAndPlugctl(t *testing.T) {
	n := startPlugd(t, "handlers:\n- {type: CSIPlugin, handler: accept}\n- {type: example.com/Greeter, handler: accept}\n")

	if code, body := n.get(t, "/readyz"); code != http.StatusOK {
		t.Errorf("/readyz after the first scan = %d %s", code, body)
	}
	if code, _ := n.get(t, "/healthz"); code != http.StatusOK {
		t.Errorf("/healthz = %d", code)
	}

	// plugctl wait started before the plugin exists, and sees it register.
	type result struct {
		out  string
		code int
		err  error
	}
	waited := make(chan result, 1)
	go func() {
		out, code, err := runPlugctl(n.socket, "wait", "--name", "greeter.example.com", "--for", "registered", "--timeout", "15s")
		waited <- result{out, code, err}
	}()
	greeter := n.plugin(t, "-type", "example.com/Greeter", "-name", "greeter.example.com")
	if w := <-waited; w.err != nil || w.code != 0 {
		t.Fatalf("plugctl wait = %d, %v: %s", w.code, w.err, w.out)
	}

	// A CSI driver, and a plugin of a type nobody handles.
	n.plugin(t, "-type", "CSIPlugin", "-name", "csi.example.com", "-socket", "csi.sock", "-versions", "1.0.0")
	n.plugin(t, "-type", "example.com/Nope", "-name", "nope", "-socket", "nope.sock")
	if out, code := plugctl(t, n.socket, "wait", "--name", "csi.example.com", "--for", "registered", "--timeout", "15s"); code != 0 {
		t.Fatalf("wait for csi = %d: %s", code, out)
	}
	if out, code := plugctl(t, n.socket, "wait", "--name", "nope", "--for", "rejected", "--timeout", "15s"); code != 0 {
		t.Fatalf("wait for the rejection = %d: %s", code, out)
	}

	out, code := plugctl(t, n.socket, "list")
	if code != 0 {
		t.Fatalf("list = %d: %s", code, out)
	}
	for _, want := range []string{"greeter.example.com.sock", "csi.sock", "nope.sock", "Registered", "Rejected", "no handler"} {
		if !strings.Contains(out, want) {
			t.Errorf("plugctl list lacks %q:\n%s", want, out)
		}
	}
	out, code = plugctl(t, n.socket, "get", "nope.sock", "-o", "json")
	var nope api.Plugin
	if code != 0 || json.Unmarshal([]byte(out), &nope) != nil || nope.State != "Rejected" || nope.Reason != "no_handler" || !strings.Contains(nope.LastError, "example.com/Nope") {
		t.Errorf("plugctl get nope.sock = %d %s", code, out)
	}
	if out, code := plugctl(t, n.socket, "get", "ghost.sock"); code != 1 || !strings.Contains(out, "ghost.sock") {
		t.Errorf("get of an unknown plugin = %d %s", code, out)
	}

	// Waiting for what does not happen times out with its own exit code.
	if out, code := plugctl(t, n.socket, "wait", "--name", "ghost", "--for", "registered", "--timeout", "300ms"); code != 3 {
		t.Errorf("wait for a plugin that never comes = %d, want 3: %s", code, out)
	}
	if out, code := plugctl(t, n.socket, "wait", "--for", "registered"); code != 2 {
		t.Errorf("wait without a selector = %d, want 2: %s", code, out)
	}

	// The greeter stops; it is deregistered and gone.
	if code := greeter.stop(t, syscall.SIGTERM); code != 0 {
		t.Errorf("plugin exit code %d: %s", code, greeter.out)
	}
	if out, code := plugctl(t, n.socket, "wait", "--name", "greeter.example.com", "--for", "gone", "--timeout", "15s"); code != 0 {
		t.Errorf("wait --for gone = %d: %s", code, out)
	}

	code, metrics := n.get(t, "/metrics")
	for _, want := range []string{
		`plugd_plugins{state="Registered",type="CSIPlugin"} 1`,
		`plugd_plugins{state="Registered",type="example.com/Greeter"} 0`,
		`plugd_plugins{state="Rejected",type="other"} 1`,
		`plugd_registration_failures_total{reason="no_handler",type="other"} 1`,
		`plugd_deregistrations_total{type="example.com/Greeter"} 1`,
		`plugd_registration_latency_seconds_count{type="CSIPlugin"} 1`,
	} {
		if code != http.StatusOK || !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}

	// SIGTERM: plugd exits cleanly, and leaves no socket of its own behind.
	if code := n.plugd.stop(t, syscall.SIGTERM); code != 0 {
		t.Errorf("plugd exit code %d:\n%s", code, n.plugd.out)
	}
	if _, err := os.Lstat(n.socket); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("status socket left behind: %v", err)
	}
	if !strings.Contains(n.plugd.out.String(), "plugd stopped") {
		t.Errorf("plugd did not log a clean stop:\n%s", n.plugd.out)
	}
	// Without plugd, plugctl says how to reach it.
	if out, code := plugctl(t, n.socket, "list"); code != 1 || !strings.Contains(out, "is plugd running") {
		t.Errorf("plugctl without plugd = %d %s", code, out)
	}
}

// TestReadyz: /readyz answers 503 until plugd has walked its registry
// directory, then 200. A directory of 10,000 subdirectories makes the first
// walk (and the inotify watch of each) last long enough to be seen from
// outside; a plugin's socket at the bottom of it is known once plugd is ready.
func TestReadyz(t *testing.T) {
	n := launchPlugd(t, "", func(reg string) {
		for i := range 10000 {
			if err := os.MkdirAll(filepath.Join(reg, fmt.Sprintf("d%02d", i/250), fmt.Sprintf("e%03d", i%250)), 0o750); err != nil {
				t.Fatal(err)
			}
		}
	})
	deep := filepath.Join(n.reg, "d39", "e249")
	pl := n.plugin(t, "-dir", deep, "-type", "CSIPlugin", "-name", "deep", "-versions", "1.0.0")
	notReady := n.waitReady(t, time.Millisecond)
	if notReady == 0 {
		t.Error("/readyz was never 503 before the first walk was done")
	}
	t.Logf("/readyz answered 503 %d times, then 200", notReady)
	p, err := n.client.Plugin(context.Background(), "d39/e249/deep.sock")
	if err != nil {
		t.Fatalf("after /readyz, the plugin in the deepest directory is not known: %v", err)
	}
	if p.Name != "" && p.Name != "deep" {
		t.Errorf("plugin = %+v", p)
	}
	if code := pl.stop(t, syscall.SIGTERM); code != 0 {
		t.Errorf("plugin exit code %d", code)
	}
	if code := n.plugd.stop(t, syscall.SIGTERM); code != 0 {
		t.Errorf("plugd exit code %d", code)
	}
}

func TestBadConfigIsRefused(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(path, []byte("registryDir: /tmp/x\nworkrs: 4\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := start(t, "plugd", "--config", path)
	if code := p.wait(t); code == 0 || !strings.Contains(p.out.String(), "unknown key workrs") || !strings.Contains(p.out.String(), path) {
		t.Errorf("plugd with a bad config: exit %d\n%s", code, p.out)
	}
	p = start(t, "plugd", "--registry-dir", dir, "--status-tcp", "0.0.0.0:1", "--status-socket", "none")
	if code := p.wait(t); code == 0 || !strings.Contains(p.out.String(), "status.tcp") {
		t.Errorf("plugd with a public TCP address: exit %d\n%s", code, p.out)
	}
}
