package doctor

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/plugd/plugd/api"
)

// Issue 25, item 2: real processes that call themselves the kubelet, as
// any local user can start them (exec -a kubelet python3 ... --root-dir
// /tmp/evil), do not mislead the doctor, and cannot hide the real one by
// coming first; the real one's --root-dir, a command line's text, is
// escaped in what GET /v1/findings serves. Before, the first process named
// kubelet was believed: an ERROR other-kubelet-root with a remedy pointing
// plugd at the fake's directory, and the command line's control
// characters served as they were.
func TestRealProcessesNamedKubelet(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// A directory every user may enter, with the test binary in it under
	// the kubelet's name.
	dir, err := os.MkdirTemp("", "doctor-kubelet")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	named := filepath.Join(dir, "kubelet")
	if err := os.Link(self, named); err != nil {
		b, err := os.ReadFile(self)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(named, b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.Chmod(named, 0o755)

	// The fakes start first, so that /proc lists them before the kubelet.
	python := start(t, self, nil, "kubelet", "--root-dir=/tmp/evil-interpreter")
	var nobody *exec.Cmd
	if os.Geteuid() == 0 {
		nobody = start(t, named, &syscall.Credential{Uid: 65534, Gid: 65534}, "kubelet", "--root-dir=/tmp/evil-user")
	}
	root := filepath.Join(dir, "root\x1b[2J\u202e")
	kubelet := start(t, named, nil, "/usr/bin/kubelet", "--config=/etc/kubernetes/kubelet.yaml", "--root-dir", root)

	reg := filepath.Join(dir, "reg")
	fs := Check(context.Background(), Input{RegistryDir: reg, ProcDir: "/proc", KubeletRoots: []string{}})
	pid := func(c *exec.Cmd) string { return "pid " + strconv.Itoa(c.Process.Pid) + "," }

	// The kubelet is found, its root escaped.
	escaped := filepath.Join(dir, `root\x1b[2J\u202e`, "plugins_registry")
	var mine []api.Finding
	for _, f := range findings(fs, "other-kubelet-root", "") {
		if slices.ContainsFunc(f.Evidence, func(e string) bool { return strings.HasPrefix(e, "kubelet "+pid(kubelet)) }) {
			mine = append(mine, f)
		}
		if strings.Contains(f.Summary+f.Remedy+strings.Join(f.Evidence, " "), "evil") {
			t.Errorf("a fake kubelet is believed: %+v", f)
		}
	}
	if len(mine) != 1 || mine[0].Severity != api.SeverityError || !strings.Contains(mine[0].Summary, escaped) || !strings.Contains(mine[0].Remedy, "registryDir "+escaped) {
		t.Errorf("the kubelet's finding: %+v; want one error naming %s", mine, escaped)
	}

	// The fakes are named, with why they are not taken.
	ignored := findings(fs, "kubelet-process-ignored", "")
	if len(ignored) != 1 {
		t.Fatalf("processes not taken for the kubelet: %+v", ignored)
	}
	text := strings.Join(ignored[0].Evidence, "\n")
	if !strings.Contains(text, pid(python)+" named kubelet, --root-dir /tmp/evil-interpreter: not taken, as it runs "+self) {
		t.Errorf("the fake with another program is not listed as such:\n%s", text)
	}
	if nobody != nil && !strings.Contains(text, pid(nobody)+" named kubelet, --root-dir /tmp/evil-user: not taken, as it runs as uid 65534") {
		t.Errorf("the fake of another user is not listed as such:\n%s", text)
	}
	if strings.Contains(text, pid(kubelet)) {
		t.Errorf("the kubelet is listed as not taken:\n%s", text)
	}

	// Nothing of a command line reaches a terminal raw.
	b, err := json.Marshal(fs)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), `\u001b`) || strings.ContainsRune(string(b), '\u202e') {
		t.Errorf("control characters in the findings: %s", b)
	}
}

// start runs exe as a process whose command line is argv (argv[0] as the
// caller wants it, as exec -a does), as cred's user if set, idle until the
// test ends.
func start(t *testing.T, exe string, cred *syscall.Credential, argv ...string) *exec.Cmd {
	t.Helper()
	cmd := &exec.Cmd{Path: exe, Args: argv, Env: append(os.Environ(), idleEnv+"=1"),
		SysProcAttr: &syscall.SysProcAttr{Credential: cred}}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil { // returns once the program runs: /proc shows its command line
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		if err := cmd.Wait(); err != nil && !errors.Is(err, io.EOF) {
			t.Errorf("%s: %v", argv[0], err)
		}
	})
	return cmd
}
