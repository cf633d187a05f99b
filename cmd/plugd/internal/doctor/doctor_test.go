package doctor

import (
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	drahealthv1 "k8s.io/kubelet/pkg/apis/dra-health/v1"

	"github.com/plugd/plugd/api"
	"github.com/plugd/plugd/internal/testenv"
)

func TestMain(m *testing.M) {
	if os.Getenv(idleEnv) != "" {
		idle()
		return
	}
	goleak.VerifyTestMain(m)
}

// idleEnv makes the test binary idle instead of testing: it is then a
// process with the command line its starter chose (see
// TestRealProcessesNamedKubelet).
const idleEnv = "PLUGD_DOCTOR_TEST_IDLE"

// idle waits until its standard input is closed: the test that started it
// has ended.
func idle() {
	io.Copy(io.Discard, os.Stdin)
	os.Exit(0)
}

// listen serves a unix socket at path until the test ends.
func listen(t *testing.T, path string) net.Listener {
	t.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// serveGRPC serves s on path until the test ends.
func serveGRPC(t *testing.T, path string, s *grpc.Server) {
	t.Helper()
	l := listen(t, path)
	go s.Serve(l)
	t.Cleanup(s.Stop)
}

// quietHealth implements the DRA health service and sends nothing, as a
// driver with no news does.
type quietHealth struct {
	drahealthv1.UnimplementedDRAResourceHealthServer
}

func (quietHealth) NodeWatchResources(_ *drahealthv1.NodeWatchResourcesRequest, s grpc.ServerStreamingServer[drahealthv1.NodeWatchResourcesResponse]) error {
	<-s.Context().Done()
	return nil
}

// findings are those of fs of check and socket; "" matches any.
func findings(fs []api.Finding, check, socket string) []api.Finding {
	var out []api.Finding
	for _, f := range fs {
		if (check == "" || f.Check == check) && (socket == "" || f.Socket == socket) {
			out = append(out, f)
		}
	}
	return out
}

func TestCheck(t *testing.T) {
	dir := testenv.ShortDir(t, "doc")
	reg := filepath.Join(dir, "reg")
	other := filepath.Join(dir, "k3s")
	for _, d := range []string{reg, filepath.Join(other, "plugins_registry")} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	p := func(name string) string { return filepath.Join(reg, name) }

	testenv.DeadSocket(t, p("stale.sock"))
	testenv.DeadSocket(t, p("old.sock"))
	listen(t, p("new.sock"))
	listen(t, p("csi.sock"))
	testenv.DeadSocket(t, filepath.Join(dir, "dead-endpoint.sock"))
	listen(t, filepath.Join(other, "plugins_registry", "lost.sock"))
	unimplemented := grpc.NewServer() // serves nothing: every method is Unimplemented
	serveGRPC(t, filepath.Join(dir, "dra-a.sock"), unimplemented)
	implemented := grpc.NewServer()
	drahealthv1.RegisterDRAResourceHealthServer(implemented, quietHealth{})
	serveGRPC(t, filepath.Join(dir, "dra-b.sock"), implemented)

	created := time.Now().Add(-3 * time.Hour)
	long := "/" + strings.Repeat("x", 120) + ".sock"
	in := Input{
		RegistryDir:  reg,
		KubeletRoots: []string{other},
		Now:          time.Now(),
		Expect:       []Expected{{Type: "CSIPlugin", Name: "missing.example.com", Condition: "missing.example.com/CSIPluginReady"}},
		Kubernetes: []KubernetesProblem{{Operation: "list and watch CSINode node-a", Reason: "Forbidden",
			Message: "csinodes is forbidden", Permission: "list, watch csinodes.storage.k8s.io", Since: time.Now()}},
		Plugins: []Target{
			{Socket: p("stale.sock"), Type: "CSIPlugin", Name: "gone.example.com", State: "Stale", Created: created, Remembered: true},
			{Socket: p("old.sock"), Type: "DevicePlugin", Name: "vendor.example/gpu", Versions: []string{"v1beta1"}, State: "Stale", Remembered: true},
			{Socket: p("new.sock"), Type: "DevicePlugin", Name: "vendor.example/gpu", Versions: []string{"v1beta1"}, Endpoint: p("new.sock"), State: "Answering", Answering: true},
			{Socket: p("csi.sock"), Type: "CSIPlugin", Name: "csi.example.com", Versions: []string{"0.3.0"}, Endpoint: filepath.Join(dir, "dead-endpoint.sock"), State: "Answering", Answering: true,
				Kubelet: &api.KubeletView{State: api.KubeletNotRegistered, Reason: "NotInCSINode", Message: "CSINode node-a spec.drivers does not list it", Since: created}},
			{Socket: p("dra-a.sock"), Type: "DRAPlugin", Name: "a.example.com", Versions: []string{"v1.DRAPlugin", "v1.DRAResourceHealth"}, Endpoint: filepath.Join(dir, "dra-a.sock"), State: "Answering", Answering: true},
			{Socket: p("dra-b.sock"), Type: "DRAPlugin", Name: "b.example.com", Versions: []string{"v1.DRAPlugin", "v1.DRAResourceHealth"}, Endpoint: filepath.Join(dir, "dra-b.sock"), State: "Answering", Answering: true},
			{Socket: long, State: "NotAnswering"},
			{Socket: p("dra-c.sock"), Type: "DRAPlugin", Name: "c.example.com", Versions: []string{"v2.DRAPlugin"}, Endpoint: filepath.Join(dir, "dra-b.sock"), State: "Answering", Answering: true},
		},
	}
	fs := Check(context.Background(), in)
	for _, f := range fs {
		t.Logf("%s %s %s: %s %q -> %s", f.Severity, f.Check, f.Socket, f.Summary, f.Evidence, f.Remedy)
	}
	for _, want := range []struct {
		check, socket, severity, text string
	}{
		{"stale-socket", p("stale.sock"), api.SeverityWarning, "3h0m0s ago"},
		{"duplicate-dead", p("old.sock"), api.SeverityWarning, p("new.sock")},
		{"endpoint-dead", p("csi.sock"), api.SeverityError, "connection refused"},
		{"versions-refused", p("csi.sock"), api.SeverityError, "CSI 1.x"},
		{"versions-refused", p("dra-c.sock"), api.SeverityError, "v1.DRAPlugin"},
		{"health-service-missing", p("dra-a.sock"), api.SeverityWarning, "Unimplemented"},
		{"socket-path-too-long", long, api.SeverityError, "126 bytes"},
		{"kubelet-not-registered", p("csi.sock"), api.SeverityWarning, "likely cause: the kubelet refuses this CSI driver"},
		{"other-kubelet-root", filepath.Join(other, "plugins_registry", "lost.sock"), api.SeverityWarning, "wrong kubelet root"},
		{"expected-missing", "", api.SeverityError, "missing.example.com"},
		{"kubernetes-api", "", api.SeverityError, "list, watch csinodes.storage.k8s.io"},
	} {
		got := findings(fs, want.check, want.socket)
		if len(got) != 1 {
			t.Errorf("%s of %s: %d findings, want 1", want.check, want.socket, len(got))
			continue
		}
		f := got[0]
		all := f.Summary + " " + strings.Join(f.Evidence, " ") + " " + f.Remedy
		if f.Severity != want.severity || !strings.Contains(all, want.text) || f.Remedy == "" {
			t.Errorf("%s of %s: %+v; want severity %s and %q", want.check, want.socket, f, want.severity, want.text)
		}
	}
	for _, quiet := range []string{p("new.sock"), p("dra-b.sock")} {
		if got := findings(fs, "", quiet); len(got) != 0 {
			t.Errorf("a healthy plugin has findings: %+v", got)
		}
	}
	if len(findings(fs, "stale-socket", p("old.sock"))) != 0 {
		t.Error("the dead old instance is reported as a stale socket too")
	}
	if fs[0].Severity != api.SeverityError || fs[len(fs)-1].Severity == api.SeverityError {
		t.Errorf("findings are not most serious first")
	}
}

// A kubelet found among the processes, with a --root-dir other than the
// directory plugd watches, is the cause to report; a process is taken for
// the kubelet by what the kernel says of it (its uid, its executable), not
// by the name it gives itself, and every one is looked at. The processes
// here are made up (a directory per pid with its cmdline, status and exe);
// TestRealProcessesNamedKubelet runs real ones.
func TestRunningKubeletRoot(t *testing.T) {
	dir := t.TempDir()
	proc := filepath.Join(dir, "proc")
	root := filepath.Join(dir, "custom")
	self := strconv.Itoa(os.Geteuid())
	process := func(pid, cmdline, uids, exe string) {
		t.Helper()
		d := filepath.Join(proc, pid)
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(d, "cmdline"), []byte(cmdline), 0o644)
		os.WriteFile(filepath.Join(d, "status"), []byte("Name:\tx\nUid:\t"+uids+"\nGid:\t0\t0\t0\t0\n"), 0o644)
		if err := os.Symlink(exe, filepath.Join(d, "exe")); err != nil {
			t.Fatal(err)
		}
	}
	// Fakes first, in the order /proc lists them: none of them may hide the kubelet.
	process("1000", "kubelet\x00--root-dir=/tmp/evil-python\x00", "0\t0\t0\t0", "/usr/bin/python3.11")
	process("1001", "kubelet\x00--root-dir=/tmp/evil-user\x00", "1234\t1234\t1234\t1234", "/home/u/kubelet")
	process("1002", "kubelet\x00--root-dir=/tmp/evil-setuid\x00", "1234\t0\t0\t0", "/home/u/kubelet")
	process("1003", "/bin/sh\x00-c\x00kubelet --root-dir=/tmp/evil-sh\x00", "0\t0\t0\t0", "/bin/sh")
	process("4242", "/usr/bin/kubelet\x00--config=/etc/k.yaml\x00--root-dir\x00"+root+"\x00", self+"\t"+self+"\t"+self+"\t"+self, "/usr/bin/kubelet (deleted)")
	os.WriteFile(filepath.Join(proc, "self"), nil, 0o644)
	fs := Check(context.Background(), Input{RegistryDir: "/var/lib/kubelet/plugins_registry", ProcDir: proc, KubeletRoots: []string{}})
	got := findings(fs, "other-kubelet-root", "")
	if len(got) != 1 || !strings.Contains(got[0].Summary, root+"/plugins_registry") || !strings.Contains(got[0].Evidence[0], "pid 4242") {
		t.Errorf("findings: %+v", fs)
	}
	ignored := findings(fs, "kubelet-process-ignored", "")
	if len(ignored) != 1 || ignored[0].Severity != api.SeverityInfo || len(ignored[0].Evidence) != 3 {
		t.Fatalf("the processes not taken for the kubelet: %+v", ignored)
	}
	for i, want := range []string{
		"pid 1000, named kubelet, --root-dir /tmp/evil-python: not taken, as it runs /usr/bin/python3.11, not a program named kubelet",
		"pid 1001, named kubelet, --root-dir /tmp/evil-user: not taken, as it runs as uid 1234, neither root nor plugd's user",
		"pid 1002, named kubelet, --root-dir /tmp/evil-setuid: not taken, as it runs as uid 1234 (effective 0), neither root nor plugd's user",
	} {
		if ignored[0].Evidence[i] != want {
			t.Errorf("evidence %d: %q, want %q", i, ignored[0].Evidence[i], want)
		}
	}
}

// A refused permission's remedy names the manifest that grants it.
func TestKubernetesRemedy(t *testing.T) {
	for _, tc := range []struct{ perm, manifest string }{
		{"patch nodes/status", "deploy/kubernetes/daemonset.yaml"},
		{"patch nodes", "deploy/kubernetes/remove-taint-rbac.yaml"},
	} {
		fs := Check(context.Background(), Input{RegistryDir: t.TempDir(), KubeletRoots: []string{}, Now: time.Now(),
			Kubernetes: []KubernetesProblem{{Operation: "do it", Reason: "Forbidden", Permission: tc.perm, Since: time.Now()}}})
		if len(fs) != 1 || !strings.Contains(fs[0].Summary, tc.perm) || !strings.Contains(fs[0].Remedy, "kubectl apply -f "+tc.manifest) {
			t.Errorf("lacking %q: %+v; want a remedy that applies %s", tc.perm, fs, tc.manifest)
		}
	}
}

// The kubelet's own truth: a kubelet plugd cannot read, one that is not
// running, a driver it refuses for its topology, a CSINode entry it does not
// hold, and an expected plugin's condition as the Node has it, apart from
// the write plugd has not made.
func TestKubeletTruth(t *testing.T) {
	dir := testenv.ShortDir(t, "doc")
	reg := filepath.Join(dir, "reg")
	if err := os.MkdirAll(reg, 0o750); err != nil {
		t.Fatal(err)
	}
	stale := filepath.Join(reg, "csi.sock")
	testenv.DeadSocket(t, stale)
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	in := Input{RegistryDir: reg, KubeletRoots: []string{}, Now: now,
		Plugins: []Target{{Socket: stale, Type: "CSIPlugin", Name: "csi.example.com", State: "NotAnswering", Remembered: true,
			Kubelet: &api.KubeletView{State: api.KubeletNotRegistered, Reason: "TopologyConflict", Message: "the driver reports topology.example.com/node=b but Node n has the label topology.example.com/node=a"}}},
		Expect:       []Expected{{Type: "DevicePlugin", Name: "vendor.example/gpu", Condition: "vendor.example/gpu-DevicePluginReady"}},
		Kubelet:      &KubeletAccess{Address: "10.0.0.1:10250", Reason: "KubeletForbidden", Permission: "get nodes/metrics", Message: "the kubelet refuses", Since: now.Add(-time.Minute)},
		StaleCSINode: []StaleEntry{{Driver: "old.example.com", NodeID: "n", Remedy: "kubectl patch csinode n --type=json -p '[...]'"}},
		Conditions: []Condition{{Type: "DevicePlugin", Name: "vendor.example/gpu", Condition: "vendor.example/gpu-DevicePluginReady",
			Status: "True", Reason: "PluginReady", Transition: now.Add(-time.Hour), Heartbeat: now.Add(-time.Minute),
			Pending: true, WantStatus: "False", WantReason: "SocketMissing"}},
		Kubernetes: []KubernetesProblem{{Operation: "patch nodes/status of n", Reason: "APIUnavailable", Message: "refused", Since: now}},
	}
	fs := Check(context.Background(), in)
	for _, tc := range []struct{ check, want string }{
		{"topology-conflict", "remove the stale label"},
		{"kubelet-unreadable", `grant plugd's ServiceAccount "get nodes/metrics"`},
		{"stale-csinode-entry", "kubectl patch csinode n"},
		{"condition-pending", "cannot write it"},
	} {
		got := findings(fs, tc.check, "")
		if len(got) != 1 || !strings.Contains(got[0].Summary+got[0].Remedy, tc.want) {
			t.Errorf("%s: %+v; want one that says %q", tc.check, got, tc.want)
		}
	}
	missing := findings(fs, "expected-missing", "")
	if len(missing) != 1 || !strings.Contains(strings.Join(missing[0].Evidence, "\n"),
		"the Node's condition vendor.example/gpu-DevicePluginReady is True (PluginReady) since 2026-01-01T11:00:00Z, last written 1m0s ago\nplugd's write of False (SocketMissing) is pending") {
		t.Errorf("expected-missing: %+v", missing)
	}

	in.StaleCSINode = append(in.StaleCSINode, StaleEntry{More: 29984})
	if got := findings(Check(context.Background(), in), "stale-csinode-entry", ""); len(got) != 2 || !strings.Contains(got[1].Summary, "29984 more drivers") {
		t.Errorf("stale entries beyond those told one by one: %+v", got)
	}

	in.Kubelet = &KubeletAccess{Address: "10.0.0.1:10250", Reason: "KubeletMetricMissing", Message: "no plugin_manager_total_plugins"}
	if got := findings(Check(context.Background(), in), "kubelet-unreadable", ""); len(got) != 1 || !strings.Contains(got[0].Summary, "(KubeletMetricMissing)") || !strings.Contains(got[0].Remedy, "ALPHA") {
		t.Errorf("a kubelet that renamed its metric: %+v", got)
	}
	in.Kubelet = &KubeletAccess{Address: "10.0.0.1:10250", Reason: "KubeletNotRunning", Message: "refused"}
	if got := findings(Check(context.Background(), in), "kubelet-not-running", ""); len(got) != 1 || got[0].Severity != api.SeverityError {
		t.Errorf("kubelet-not-running: %+v", got)
	}
	in.Kubelet = &KubeletAccess{Address: "10.0.0.1:10250", Live: true}
	fs = Check(context.Background(), in)
	if len(findings(fs, "kubelet-unreadable", ""))+len(findings(fs, "kubelet-not-running", "")) != 0 {
		t.Errorf("findings about a kubelet plugd reads: %+v", fs)
	}
}

// Issue 33, item 11: a root process running a program named kubelet is a
// kubelet in a container when its mount namespace is not init's (a kind
// node, a test cluster): not taken, with why. One in init's namespace is
// taken, and its finding says what was assumed; where init's cannot be
// read, plugd's own is the reference, and the finding says so. The
// processes are made up: a directory per pid, its ns/mnt a symlink whose
// text is the namespace, as the kernel's reads.
func TestKubeletInAnotherMountNamespace(t *testing.T) {
	for _, tc := range []struct {
		name       string
		init, self string // the namespaces of pid 1 and of plugd; "" unreadable
		taken      string // the pid taken for the kubelet
		says       string
		ignored    string
	}{
		{name: "init's readable", init: "mnt:[1]", self: "mnt:[9]", taken: "4242", says: "in init's mount namespace mnt:[1]: the host's",
			ignored: "pid 4300, named kubelet, --root-dir /var/lib/kind/kubelet: not taken, as it runs in the mount namespace mnt:[2], not init's (mnt:[1]): a kubelet in a container"},
		{name: "only plugd's readable", self: "mnt:[1]", taken: "4242", says: "in plugd's own mount namespace mnt:[1] (init's cannot be read): taken as the host's"},
		{name: "none readable", taken: "4242", says: "its mount namespace cannot be read: taken as the host's"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			proc := filepath.Join(t.TempDir(), "proc")
			process := func(pid, cmdline, ns string) {
				t.Helper()
				d := filepath.Join(proc, pid)
				if err := os.MkdirAll(filepath.Join(d, "ns"), 0o755); err != nil {
					t.Fatal(err)
				}
				os.WriteFile(filepath.Join(d, "cmdline"), []byte(cmdline), 0o644)
				os.WriteFile(filepath.Join(d, "status"), []byte("Name:\tx\nUid:\t0\t0\t0\t0\n"), 0o644)
				os.Symlink("/usr/bin/kubelet", filepath.Join(d, "exe"))
				if ns != "" {
					os.Symlink(ns, filepath.Join(d, "ns", "mnt"))
				}
			}
			process("1", "/sbin/init\x00", tc.init)
			process("self", "plugd\x00", tc.self)
			// The container's kubelet first: it may not hide the host's.
			containerNS := "mnt:[2]"
			hostNS := "mnt:[1]"
			if tc.init == "" && tc.self == "" {
				containerNS, hostNS = "", ""
			}
			if tc.ignored != "" {
				process("4300", "kubelet\x00--root-dir=/var/lib/kind/kubelet\x00", containerNS)
			}
			process("4242", "/usr/bin/kubelet\x00--root-dir=/var/lib/custom\x00", hostNS)
			fs := Check(context.Background(), Input{RegistryDir: "/var/lib/kubelet/plugins_registry", ProcDir: proc, KubeletRoots: []string{}})
			got := findings(fs, "other-kubelet-root", "")
			if len(got) != 1 || !strings.Contains(strings.Join(got[0].Evidence, "\n"), "kubelet pid "+tc.taken+" "+tc.says) {
				t.Errorf("the kubelet's finding: %+v; want it to say %q", got, tc.says)
			}
			ignored := findings(fs, "kubelet-process-ignored", "")
			switch {
			case tc.ignored == "" && len(ignored) != 0:
				t.Errorf("a process ignored: %+v", ignored)
			case tc.ignored != "" && (len(ignored) != 1 || !strings.HasPrefix(ignored[0].Evidence[0], tc.ignored)):
				t.Errorf("the kubelet in a container: %+v; want %q", ignored, tc.ignored)
			}
		})
	}
}

// Issue 33, item 12: a plugin plugd rejected (plugctl list shows it
// Rejected) is a finding, with plugd's reason and error and what to do
// about that reason; one whose rejection another finding explains (refused
// versions) is not reported twice.
func TestRejectedPlugins(t *testing.T) {
	dir := testenv.ShortDir(t, "rej")
	p := func(name string) string { return filepath.Join(dir, name) }
	for _, s := range []string{"greeter.sock", "bad.sock", "csi0.sock"} {
		listen(t, p(s))
	}
	fs := Check(context.Background(), Input{RegistryDir: dir, KubeletRoots: []string{}, Plugins: []Target{
		{Socket: p("greeter.sock"), Type: "example.com/Greeter", Name: "greeter", Versions: []string{"v1"}, Answering: true,
			State: api.StateRejected, Reason: api.ReasonNoHandler, LastError: `no handler for plugin type "example.com/Greeter"`},
		{Socket: p("bad.sock"), Type: "CSIPlugin", Name: "bad", Versions: []string{"1.0.0"}, Answering: true,
			State: api.StateRejected, Reason: api.ReasonValidate, LastError: "the name is not a valid CSI driver name"},
		{Socket: p("csi0.sock"), Type: "CSIPlugin", Name: "csi0.example.com", Versions: []string{"0.3.0"}, Answering: true,
			State: api.StateRejected, Reason: api.ReasonValidate, LastError: "no 1.x version"},
	}})
	for _, want := range []struct{ socket, says string }{
		{p("greeter.sock"), "--handler example.com/Greeter=accept"},
		{p("bad.sock"), "the handler refused the plugin"},
	} {
		got := findings(fs, "plugin-rejected", want.socket)
		if len(got) != 1 || got[0].Severity != api.SeverityError || !strings.Contains(got[0].Remedy, want.says) ||
			!strings.Contains(strings.Join(got[0].Evidence, "\n"), "reason: ") || !strings.Contains(strings.Join(got[0].Evidence, "\n"), "error: ") {
			t.Errorf("the rejected plugin at %s: %+v; want an error whose remedy says %q", want.socket, got, want.says)
		}
	}
	if got := findings(fs, "plugin-rejected", p("csi0.sock")); len(got) != 0 || len(findings(fs, "versions-refused", p("csi0.sock"))) != 1 {
		t.Errorf("the plugin whose versions are refused is reported twice: %+v", fs)
	}
}

// Issue 33: a ServiceAccount no admission policy confines to its Node is a
// warning that says how to install the policies; a token the policies
// refuse whole (no node name) is an error; a confined one is nothing to
// report; a write a policy refuses names the policy's parameters.
func TestConfinement(t *testing.T) {
	now := time.Now()
	for _, tc := range []struct {
		name     string
		in       Input
		severity string
		says     []string
	}{
		{"not confined", Input{Confinement: &Confinement{Message: "accepted", At: now}}, api.SeverityWarning,
			[]string{"no admission policy confines plugd's ServiceAccount", "admissionPolicy.enabled", "kubectl apply -f deploy/kubernetes/daemonset.yaml"}},
		{"no claim", Input{Confinement: &Confinement{Confined: true, NoClaim: true, Message: "carries no node name", At: now}}, api.SeverityError,
			[]string{"carries no node name", "Pod-bound ServiceAccount token", "1.30"}},
		{"confined", Input{Confinement: &Confinement{Confined: true, At: now}}, "", nil},
		{"not probed", Input{}, "", nil},
		{"a write refused", Input{Kubernetes: []KubernetesProblem{{Operation: "patch nodes/status of n", Reason: "RefusedByPolicy", Message: "ValidatingAdmissionPolicy 'plugd-node-status' ...", Since: now}}},
			api.SeverityError, []string{"an admission policy refuses plugd's write", "RELEASE-admission (key conditions)"}},
	} {
		tc.in.RegistryDir, tc.in.KubeletRoots, tc.in.Now = t.TempDir(), []string{}, now
		fs := Check(context.Background(), tc.in)
		if tc.severity == "" {
			if len(fs) != 0 {
				t.Errorf("%s: %+v", tc.name, fs)
			}
			continue
		}
		if len(fs) != 1 || fs[0].Severity != tc.severity {
			t.Errorf("%s: %+v, want one %s", tc.name, fs, tc.severity)
			continue
		}
		text := fs[0].Summary + " " + fs[0].Remedy
		for _, s := range tc.says {
			if !strings.Contains(text, s) {
				t.Errorf("%s: %q does not say %q", tc.name, text, s)
			}
		}
	}
}

// A resource any of several plugins may provide (expect with anyOf) is
// missing only while none of them has a socket: a device plugin gone after
// the move to DRA is no finding.
func TestExpectedAnyOf(t *testing.T) {
	reg := filepath.Join(testenv.ShortDir(t, "doc"), "reg")
	if err := os.MkdirAll(reg, 0o750); err != nil {
		t.Fatal(err)
	}
	res := Expected{Type: "anyOf", Name: "gpu.example.com", Condition: "gpu.example.com/Ready",
		AnyOf: []Expected{{Type: "DevicePlugin", Name: "example.com/gpu"}, {Type: "DRAPlugin", Name: "gpu.example.com"}}}
	in := Input{RegistryDir: reg, KubeletRoots: []string{}, Expect: []Expected{res}}
	got := findings(Check(context.Background(), in), "expected-missing", "")
	if len(got) != 1 || !strings.Contains(got[0].Summary, "expected resource gpu.example.com: none of its plugins (DevicePlugin example.com/gpu, DRAPlugin gpu.example.com)") {
		t.Errorf("none there: %+v", got)
	}
	in.Plugins = []Target{{Socket: filepath.Join(reg, "dra.sock"), Type: "DRAPlugin", Name: "gpu.example.com", State: "Registered", Answering: true}}
	if got := findings(Check(context.Background(), in), "expected-missing", ""); len(got) != 0 {
		t.Errorf("the DRA driver there: %+v", got)
	}
	// Its False held back while another plugin may take over says so.
	in.Conditions = []Condition{{Type: "anyOf", Name: "gpu.example.com", Condition: "gpu.example.com/Ready", Status: "True", Reason: "PluginReady",
		Pending: true, WantStatus: "False", WantReason: "SocketMissing"}}
	if got := findings(Check(context.Background(), in), "condition-pending", ""); len(got) != 1 || !strings.Contains(got[0].Remedy, "stays True for 10s") {
		t.Errorf("the switch's grace: %+v", got)
	}
}
