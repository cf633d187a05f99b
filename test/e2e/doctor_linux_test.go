package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/plugd/plugd/api"
	"github.com/plugd/plugd/internal/testenv"
	"github.com/plugd/plugd/plugin"
)

// waitState polls plugd until the plugin at id is in state.
func (n *node) waitState(t *testing.T, id, state string) {
	t.Helper()
	deadline := time.Now().Add(testenv.Timeout)
	for {
		p, err := n.client.Plugin(context.Background(), id)
		if err == nil && p.State == state {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s is not %s: %+v, %v", id, state, p, err)
		}
		time.Sleep(20 * time.Millisecond) // the poll's pace: no event marks every state
	}
}

// owner is how the doctor names the owner of a file this test made.
func owner(t *testing.T) string {
	t.Helper()
	u, err := user.LookupId(strconv.Itoa(os.Geteuid()))
	if err != nil {
		t.Fatal(err)
	}
	g, err := user.LookupGroupId(strconv.Itoa(os.Getegid()))
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("owner uid %s (%s), gid %s (%s)", u.Uid, u.Username, g.Gid, g.Name)
}

// privateKubelets runs, in a PID namespace of their own, two processes
// that are kubelets to anyone reading their process table: a shell whose
// argv[0] is "kubelet", with --root-dir fakeRoot (any user can start one;
// the doctor does not take it), and a shell run as a program named
// kubelet, as the test's user, with --root-dir root (the doctor takes
// it). It returns a proc file system of that namespace, which shows them
// and no other process of the machine (a kubelet running beside the test
// would be one more finding), and their pids there. It needs root (a PID
// namespace, a mount); without, it returns "".
func privateKubelets(t *testing.T, fakeRoot, root string) (procDir string, fake, kubelet int) {
	t.Helper()
	if os.Geteuid() != 0 {
		return "", 0, 0
	}
	sh, err := filepath.EvalSymlinks("/bin/sh")
	if err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	named := filepath.Join(bin, "kubelet") // the shell under the kubelet's name
	if err := os.Link(sh, named); err != nil {
		b, err := os.ReadFile(sh)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(named, b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	alias := filepath.Join(bin, "fake", "kubelet") // argv[0] kubelet; the kernel runs sh
	if err := os.Mkdir(filepath.Dir(alias), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(sh, alias); err != nil {
		t.Fatal(err)
	}
	procDir = t.TempDir()
	t.Cleanup(func() { syscall.Unmount(procDir, syscall.MNT_DETACH) }) // before TempDir's removal
	// pid 1 of the namespace mounts its proc, starts the two, says their
	// pids, and waits; killed, it takes them with it.
	const script = `mount -t proc proc "$1" || exit 1
"$2" -c "sleep 600; :" --root-dir="$3" & echo $!
"$4" -c "sleep 600; :" --root-dir="$5" & echo $!
wait`
	cmd := exec.Command("/bin/sh", "-c", script, "sh", procDir, alias, fakeRoot, named, root)
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	if _, err := fmt.Fscan(out, &fake, &kubelet); err != nil {
		t.Fatalf("the kubelets in their PID namespace: %v", err)
	}
	return procDir, fake, kubelet
}

// Every broken setup plugctl doctor knows, each made for real: killed
// plugins' sockets, a dead endpoint, refused versions, a health service
// nobody serves, a path too long to dial, sockets under another kubelet
// root, a kubelet running with another --root-dir (and a process that only
// calls itself the kubelet, with yet another), and an expected plugin
// that is not there. plugd manages here, where a socket that goes Stale
// forgets who it was: the doctor still knows.
func TestDoctor(t *testing.T) {
	dir := testenv.ShortDir(t, "doc")
	otherRoot := filepath.Join(dir, "k3s")
	customRoot := filepath.Join(dir, "custom")
	for _, d := range []string{filepath.Join(otherRoot, "plugins_registry"), customRoot} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	// The doctor reads a process table of the test's own: with the
	// machine's, a kubelet running beside the test is one more finding.
	procDir, fake, kubeletPid := privateKubelets(t, filepath.Join(dir, "evil"), customRoot)
	if procDir == "" {
		t.Log("not root: no PID namespace of the test's own, so no kubelet processes and no search for them")
		procDir = "none"
	}
	n := launchPlugd(t, fmt.Sprintf(`handlers: [{type: CSIPlugin, handler: accept}, {type: DRAPlugin, handler: accept}, {type: DevicePlugin, handler: accept}]
liveness: {probeInterval: 100ms, unhealthyGrace: 100ms}
expect: [{type: CSIPlugin, name: missing.example.com}]
doctor: {kubeletRoots: [%s], procDir: %s}
`, otherRoot, procDir), nil)
	n.waitReady(t, 10*time.Millisecond)

	// Killed: their sockets stay.
	gone := n.plugin(t, "-type", "CSIPlugin", "-name", "gone.example.com", "-versions", "1.0.0", "-socket", "gone.sock")
	old := n.plugin(t, "-type", "DevicePlugin", "-name", "vendor.example/gpu", "-versions", "v1beta1", "-socket", "gpu-old.sock")
	n.waitState(t, "gone.sock", "Registered")
	n.waitState(t, "gpu-old.sock", "Registered")
	gone.stop(t, syscall.SIGKILL)
	old.stop(t, syscall.SIGKILL)
	n.plugin(t, "-type", "DevicePlugin", "-name", "vendor.example/gpu", "-versions", "v1beta1", "-socket", "gpu-new.sock")
	// Versions the kubelet refuses.
	n.plugin(t, "-type", "CSIPlugin", "-name", "csi0.example.com", "-versions", "0.3.0")
	n.plugin(t, "-type", "DRAPlugin", "-name", "v2.example.com", "-versions", "v2.DRAPlugin")
	// A plugin of a type plugd has no handler for: Rejected.
	n.plugin(t, "-type", "example.com/Greeter", "-name", "greeter.example.com", "-versions", "v1", "-socket", "greeter.sock")
	// A registration socket that answers for an endpoint nobody serves.
	testenv.DeadSocket(t, filepath.Join(dir, "dead.sock"))
	testenv.StartPlugin(t, plugin.Config{Dir: n.reg, Socket: "dead-endpoint.sock", Type: "CSIPlugin", Name: "dead.example.com", Versions: []string{"1.0.0"}, Endpoint: filepath.Join(dir, "dead.sock")})
	// A DRA driver advertising the health service, serving none.
	testenv.StartPlugin(t, plugin.Config{Dir: n.reg, Socket: "health.sock", Type: "DRAPlugin", Name: "health.example.com", Versions: []string{"v1.DRAPlugin", "v1.DRAResourceHealth"}})
	// A socket whose path is too long to connect to: made short, moved deep.
	long := testenv.StartPlugin(t, plugin.Config{Dir: dir, Socket: "long.sock", Type: "CSIPlugin", Name: "long.example.com", Versions: []string{"1.0.0"}})
	deep := filepath.Join(n.reg, strings.Repeat("d", 60), strings.Repeat("e", 30))
	if err := os.MkdirAll(deep, 0o750); err != nil {
		t.Fatal(err)
	}
	longPath := filepath.Join(deep, "long.sock")
	if err := os.Rename(filepath.Join(dir, "long.sock"), longPath); err != nil {
		t.Fatal(err)
	}
	_ = long
	// A plugin writing under another kubelet root.
	testenv.StartPlugin(t, plugin.Config{Dir: filepath.Join(otherRoot, "plugins_registry"), Socket: "lost.sock", Type: "CSIPlugin", Name: "lost.example.com", Versions: []string{"1.0.0"}})

	for _, id := range []string{"gpu-new.sock", "csi0.example.com.sock", "v2.example.com.sock", "dead-endpoint.sock", "health.sock"} {
		n.waitState(t, id, "Registered")
	}
	n.waitState(t, "greeter.sock", "Rejected")
	n.waitState(t, "gone.sock", "Stale")
	n.waitState(t, "gpu-old.sock", "Stale")
	rel, _ := filepath.Rel(n.reg, longPath)
	n.waitState(t, rel, "Rejected") // once, never dialled: no retry can shorten it

	out, code := plugctl(t, n.socket, "doctor")
	t.Logf("plugctl doctor:\n%s", out)
	if code != 4 {
		t.Errorf("plugctl doctor exited %d, want 4", code)
	}
	out, _ = plugctl(t, n.socket, "doctor", "-o", "json")
	var list api.FindingList
	if err := json.NewDecoder(strings.NewReader(out)).Decode(&list); err != nil { // stderr follows
		t.Fatalf("%v:\n%s", err, out)
	}
	find := func(check, socket string) *api.Finding {
		for i, f := range list.Findings {
			if f.Check == check && f.Socket == socket {
				return &list.Findings[i]
			}
		}
		return nil
	}
	reg := func(id string) string { return filepath.Join(n.reg, id) }
	type wanted struct {
		check, socket, severity string
		says                    []string
	}
	lost := wanted{"other-kubelet-root", filepath.Join(otherRoot, "plugins_registry", "lost.sock"), api.SeverityWarning, []string{"the plugin writes under the wrong kubelet root: set its kubelet directory to " + customRoot}}
	kubelets := []wanted{
		{"other-kubelet-root", "", api.SeverityError, []string{fmt.Sprintf("kubelet pid %d, --root-dir %s", kubeletPid, customRoot), "registryDir " + filepath.Join(customRoot, "plugins_registry"), fmt.Sprintf("kubelet pid %d in init's mount namespace", kubeletPid)}},
		{"kubelet-process-ignored", "", api.SeverityInfo, []string{fmt.Sprintf("pid %d, named kubelet, --root-dir %s: not taken, as it runs ", fake, filepath.Join(dir, "evil")), "not a program named kubelet"}},
	}
	if procDir == "none" {
		lost.says = []string{"if this node's kubelet uses " + otherRoot}
		kubelets = nil
	}
	for _, want := range append(append(kubelets, lost), []wanted{
		{"stale-socket", reg("gone.sock"), api.SeverityWarning, []string{"ago)", owner(t), "it was CSIPlugin gone.example.com when it last answered", "connection refused", "rm " + reg("gone.sock")}},
		{"duplicate-dead", reg("gpu-old.sock"), api.SeverityWarning, []string{"vendor.example/gpu", "answering: " + reg("gpu-new.sock")}},
		{"versions-refused", reg("csi0.example.com.sock"), api.SeverityError, []string{"no CSI 1.x version", "versions: [0.3.0]"}},
		{"versions-refused", reg("v2.example.com.sock"), api.SeverityError, []string{"neither v1.DRAPlugin nor v1beta1.DRAPlugin"}},
		{"endpoint-dead", reg("dead-endpoint.sock"), api.SeverityError, []string{filepath.Join(dir, "dead.sock"), "connection refused"}},
		{"health-service-missing", reg("health.sock"), api.SeverityWarning, []string{"Unimplemented"}},
		{"socket-path-too-long", longPath, api.SeverityError, []string{fmt.Sprintf("%d bytes long", len(longPath))}},
		{"expected-missing", "", api.SeverityError, []string{"missing.example.com"}},
		{"plugin-rejected", reg("greeter.sock"), api.SeverityError, []string{"reason: no_handler", "--handler example.com/Greeter=accept"}},
	}...) {
		f := find(want.check, want.socket)
		if f == nil {
			t.Errorf("no %s finding for %q", want.check, want.socket)
			continue
		}
		all := f.Summary + "\n" + strings.Join(f.Evidence, "\n") + "\n" + f.Remedy
		for _, s := range want.says {
			if !strings.Contains(all, s) {
				t.Errorf("%s of %s does not say %q:\n%s", want.check, want.socket, s, all)
			}
		}
		if f.Severity != want.severity {
			t.Errorf("%s of %s is %s, want %s", want.check, want.socket, f.Severity, want.severity)
		}
	}
	if f := find("stale-socket", reg("gpu-old.sock")); f != nil {
		t.Errorf("the old instance's socket is reported as a lone stale socket: %+v", f)
	}
}

// A socket plugd may not connect to: the plugin made it root's alone, and
// plugd runs as nobody. The doctor says so, with both sides' ids.
func TestDoctorPermission(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root, to run plugd as another user")
	}
	const nobody = 65534
	dir := testenv.ShortDir(t, "perm")
	reg, run := filepath.Join(dir, "reg"), filepath.Join(dir, "run")
	for _, d := range []string{reg, run} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(run, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	testenv.StartPlugin(t, plugin.Config{Dir: reg, Socket: "root-only.sock", Type: "CSIPlugin", Name: "root.example.com", Versions: []string{"1.0.0"}})
	if err := os.Chmod(filepath.Join(reg, "root-only.sock"), 0o600); err != nil {
		t.Fatal(err)
	}
	// plugd, as nobody, from a copy nobody may run.
	b, err := os.ReadFile(filepath.Join(bin, "plugd"))
	if err != nil {
		t.Fatal(err)
	}
	exe := filepath.Join(dir, "plugd")
	if err := os.WriteFile(exe, b, 0o755); err != nil {
		t.Fatal(err)
	}
	socket := filepath.Join(run, "plugd.sock")
	cmd := exec.Command(exe, "--registry-dir", reg, "--status-socket", socket, "--backoff-initial", "50ms")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	n := &node{reg: reg, socket: socket, plugd: startCmd(t, cmd), client: &api.Client{Socket: socket}}
	n.waitReady(t, 10*time.Millisecond)
	deadline := time.Now().Add(testenv.Timeout)
	for {
		p, err := n.client.Plugin(context.Background(), "root-only.sock")
		if err == nil && p.Attempts > 0 && p.State != "Registering" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("plugd never tried the socket: %+v, %v", p, err)
		}
		time.Sleep(20 * time.Millisecond) // the poll's pace
	}
	out, code := plugctl(t, socket, "doctor")
	t.Logf("plugctl doctor:\n%s", out)
	for _, s := range []string{"ERROR  socket-permission", "plugd (uid 65534", "is not allowed to connect", "owner uid 0 (root), gid 0 (root), mode Srw-------", "permission denied"} {
		if code != 4 || !strings.Contains(out, s) {
			t.Errorf("plugctl doctor (%d) does not say %q", code, s)
		}
	}
}
