//go:build linux

package kube

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/plugd/plugd/api"
	"github.com/plugd/plugd/internal/nodecond"
	"github.com/plugd/plugd/internal/testenv"
)

const (
	csiName   = "csi.example.com"
	gpuName   = "vendor.example/gpu"
	draName   = "gpu.example.com"
	csiCond   = "csi.example.com/CSIPluginReady"
	gpuCond   = "vendor.example/gpu-DevicePluginReady"
	draCond   = "gpu.example.com/DRAPluginReady"
	taintKey  = "example.com/plugins-not-ready"
	plugdUser = "system:serviceaccount:plugd:plugd"
)

// draDriver is a DRA driver that prepares nothing; it only publishes.
type draDriver struct{}

func (draDriver) PrepareResourceClaims(_ context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	return map[types.UID]kubeletplugin.PrepareResult{}, nil
}

func (draDriver) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	return map[types.UID]error{}, nil
}

func (draDriver) HandleError(context.Context, error, string) {}

func (draDriver) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}

// startDRA runs a real DRA driver (kubeletplugin) that registers in reg and
// publishes one ResourceSlice for node with the admin's access, as a driver
// does with its own.
func startDRA(t *testing.T, reg, data, node string) *kubeletplugin.Helper {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	h, err := kubeletplugin.Start(ctx, draDriver{}, kubeletplugin.DriverName(draName), kubeletplugin.KubeClient(admin),
		kubeletplugin.NodeName(node), kubeletplugin.RegistrarDirectoryPath(reg), kubeletplugin.PluginDataDirectoryPath(data),
		kubeletplugin.HealthService(false)) // it reports no device health, so it must not advertise the service
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		h.Stop()
		cancel()
	})
	if err := h.PublishResources(ctx, resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
		"pool": {Slices: []resourceslice.Slice{{Devices: []resourceapi.Device{{Name: "gpu-0"}}}}},
	}}); err != nil {
		t.Fatal(err)
	}
	return h
}

// One node, observed as the DaemonSet observes it where plugd cannot read
// the kubelet itself (no kubelet runs here; the test plays its API side):
// the kubelet view inferred from API objects of a CSI driver, a device
// plugin and a DRA driver, their Node conditions (True says Inferred), the
// startup taint, events; each way a plugin falls out and comes back; the
// doctor on a plugin the kubelet lacks; a quiet minute without a write;
// least privilege; and an API server that goes away.
func TestNode(t *testing.T) {
	top := t // what must outlive a subtest is the test's
	begin := time.Now()
	defer func() {
		total, err := auditCount(plugdUser, begin, time.Now())
		t.Logf("plugd's requests over the whole scenario, by verb (audit log): %v, %v", total, err)
	}()
	applyManifest(t, "deploy/kubernetes/daemonset.yaml")
	applyManifest(t, "deploy/kubernetes/remove-taint-rbac.yaml")
	token := plugdToken(t)
	const node = "node-a"
	createNode(t, node, corev1.Taint{Key: taintKey, Effect: corev1.TaintEffectNoSchedule}, corev1.Taint{Key: "example.com/other", Effect: corev1.TaintEffectNoSchedule})
	k := apiKubelet{t, node}

	dir := testenv.ShortDir(t, "kube")
	reg := filepath.Join(dir, "plugins_registry")
	for _, d := range []string{reg, filepath.Join(dir, "plugins"), filepath.Join(dir, "dra")} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := cp.WriteKubeconfig(kubeconfig, token); err != nil {
		t.Fatal(err)
	}
	csiReg := startCSI(t, reg, filepath.Join(dir, "plugins"), csiName, node)
	gpu := startDevicePlugin(t, reg, gpuName, 2)
	startDRA(t, reg, filepath.Join(dir, "dra"), node)

	config := fmt.Sprintf(`mode: observe
registryDir: %s
handlers: [{type: CSIPlugin, handler: csi}, {type: DRAPlugin, handler: dra}, {type: DevicePlugin, handler: deviceplugin}]
liveness: {probeInterval: 300ms}
kubernetes: {kubeconfig: %s, nodeName: %s, removeTaintWhenReady: "%s:NoSchedule", disagreementGrace: 2s, kubelet: {address: none}}
expect:
  - {type: CSIPlugin, name: %s}
  - {type: DevicePlugin, name: %s, minHealthyDevices: 2}
  - {type: DRAPlugin, name: %s}
doctor: {kubeletRoots: [%s]}
`, reg, kubeconfig, node, taintKey, csiName, gpuName, draName, filepath.Join(dir, "none"))
	pd := startPlugd(t, dir, config)

	t.Run("before the kubelet registers", func(t *testing.T) {
		v := pd.waitKubelet(t, csiName, api.KubeletNotRegistered, "NotInCSINode")
		if !strings.Contains(v.Message, "CSINode node-a") || v.Since.IsZero() {
			t.Errorf("view: %+v", v)
		}
		pd.waitKubelet(t, gpuName, api.KubeletNotRegistered, "NotInCapacity")
		pd.waitKubelet(t, draName, api.KubeletRegistered, "Inferred") // the driver published its slice itself
		waitCondition(t, node, csiCond, corev1.ConditionFalse, "KubeletNotRegistered")
		waitCondition(t, node, gpuCond, corev1.ConditionFalse, "KubeletNotRegistered")
		waitCondition(t, node, draCond, corev1.ConditionTrue, "Inferred")
		if !slices.ContainsFunc(getNode(t, node).Spec.Taints, func(tt corev1.Taint) bool { return tt.Key == taintKey }) {
			t.Error("the startup taint went before every expected plugin was ready")
		}
		out, code := plugctl(t, "--socket", pd.socket, "list")
		if code != 0 || !strings.Contains(out, "KUBELET") || !regexpMatch(`csi.example.com-reg.sock\s+CSIPlugin\s+csi.example.com\s+Answering\s+NotRegistered`, out) {
			t.Errorf("plugctl list (%d):\n%s", code, out)
		}
	})

	t.Run("the kubelet registers: ready, taint removed, events", func(t *testing.T) {
		k.setCSIDriver(csiName, node)
		k.setDevices(gpuName, 2, 2)
		pd.waitKubelet(t, csiName, api.KubeletRegistered, "Inferred")
		pd.waitKubelet(t, gpuName, api.KubeletRegistered, "Inferred")
		c := waitCondition(t, node, csiCond, corev1.ConditionTrue, "Inferred")
		if !strings.HasPrefix(c.Message, "plugd: CSIPlugin csi.example.com: ") {
			t.Errorf("message %q", c.Message)
		}
		waitCondition(t, node, gpuCond, corev1.ConditionTrue, "Inferred")
		eventually(t, "the startup taint removed, and only it", func() (bool, string) {
			var keys []string
			for _, tt := range getNode(t, node).Spec.Taints {
				keys = append(keys, tt.Key)
			}
			// node.kubernetes.io/not-ready is the API server's admission's.
			return slices.Equal(keys, []string{"example.com/other", "node.kubernetes.io/not-ready"}), fmt.Sprint(keys)
		})
		n := getNode(t, node)
		if c := condition(n, "example.com/KernelDeadlock"); c == nil || c.Reason != "KernelHasNoDeadlock" || condition(n, "Ready") == nil {
			t.Errorf("others' conditions changed: %+v", n.Status.Conditions)
		}
		for _, p := range []string{"CSIPlugin " + csiName, "DevicePlugin " + gpuName, "DRAPlugin " + draName} {
			ev := waitEvent(t, node, "PluginReady", p)
			if ev.Type != corev1.EventTypeNormal || ev.ReportingController != "plugd" || ev.Regarding.Kind != "Node" || ev.Regarding.Name != node {
				t.Errorf("event: %+v", ev)
			}
		}
		out, _ := plugctl(t, "--socket", pd.socket, "get", "csi.example.com-reg.sock")
		if !strings.Contains(out, "kubelet:\n  message: 'in CSINode node-a spec.drivers with nodeID \"node-a\" (inferred from API") || !strings.Contains(out, "  reason: Inferred\n") {
			t.Errorf("plugctl get:\n%s", out)
		}
		m, _ := plugctlMetrics(t, pd)
		if v, ok := metric(m, "plugd_kubelet_registered", `name="csi.example.com"`, `type="CSIPlugin"`); !ok || v != "1" {
			t.Errorf("plugd_kubelet_registered of the CSI driver = %q, %v", v, ok)
		}
		if v, _ := metric(m, "plugd_kubernetes_api_healthy"); v != "1" {
			t.Errorf("plugd_kubernetes_api_healthy = %q", v)
		}
	})

	t.Run("the CSINode entry goes: not ready, disagreement, doctor", func(t *testing.T) {
		k.setCSIDriver(csiName, "")
		c := waitCondition(t, node, csiCond, corev1.ConditionFalse, "KubeletNotRegistered")
		if !strings.Contains(c.Message, "does not list it") {
			t.Errorf("message %q", c.Message)
		}
		if ev := waitEvent(t, node, "PluginNotReady", "CSIPlugin "+csiName); ev.Type != corev1.EventTypeWarning {
			t.Errorf("event %+v", ev)
		}
		ev := waitEvent(t, node, "KubeletDisagrees", "CSIPlugin "+csiName)
		if !strings.Contains(ev.Note, "its socket answers, but the kubelet has not registered it") {
			t.Errorf("disagreement event: %q", ev.Note)
		}
		out, code := plugctl(t, "--socket", pd.socket, "doctor")
		if code != 4 || !strings.Contains(out, "WARNING  kubelet-not-registered  CSIPlugin csi.example.com") ||
			!strings.Contains(out, "likely cause: the Node or its CSINode was re-created") {
			t.Errorf("plugctl doctor (%d):\n%s", code, out)
		}
		k.setCSIDriver(csiName, node)
		waitCondition(t, node, csiCond, corev1.ConditionTrue, "Inferred")
	})

	t.Run("the driver says another node id", func(t *testing.T) {
		k.setCSIDriver(csiName, "node-a-before-it-was-recreated")
		waitCondition(t, node, csiCond, corev1.ConditionFalse, "NodeIDMismatch")
		k.setCSIDriver(csiName, node)
		waitCondition(t, node, csiCond, corev1.ConditionTrue, "Inferred")
	})

	t.Run("the socket dies and comes back", func(t *testing.T) {
		csiReg.Close()
		waitCondition(t, node, csiCond, corev1.ConditionFalse, "SocketMissing")
		csiReg = startCSI(top, reg, filepath.Join(dir, "plugins"), csiName, node)
		waitCondition(t, node, csiCond, corev1.ConditionTrue, "Inferred")
	})

	t.Run("too few healthy devices", func(t *testing.T) {
		k.setDevices(gpuName, 2, 1)
		waitCondition(t, node, gpuCond, corev1.ConditionFalse, "NoHealthyDevices")
		pd.waitKubelet(t, gpuName, api.KubeletRegistered, "AllocatableMismatch")
		k.setDevices(gpuName, 2, 2)
		waitCondition(t, node, gpuCond, corev1.ConditionTrue, "Inferred")
		// The events are sent in the background: the second PluginReady of
		// the plugin is the first of a series.
		waitEvent(t, node, "PluginNotReady", "DevicePlugin "+gpuName)
		eventually(t, "PluginReady of the device plugin counted twice", func() (bool, string) {
			ev := waitEvent(t, node, "PluginReady", "DevicePlugin "+gpuName)
			return ev.Series != nil && ev.Series.Count >= 2, fmt.Sprintf("%+v", ev.Series)
		})
	})

	t.Run("a quiet minute costs no writes", func(t *testing.T) {
		quietMinute(t, pd, node, 5*time.Minute)
	})

	t.Run("without its role plugd says what it lacks and keeps serving", func(t *testing.T) {
		ctx := context.Background()
		if err := admin.RbacV1().ClusterRoleBindings().Delete(ctx, "plugd", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		// Established watches outlive a revoked permission; a restart reads anew.
		pd.stop(t)
		pd = startPlugd(top, dir, config)
		v := pd.waitKubelet(t, csiName, api.KubeletUnknown, "Forbidden")
		if !strings.Contains(v.Message, `lacks the permission "list, watch csinodes.storage.k8s.io"`) {
			t.Errorf("view: %+v", v)
		}
		if p := pd.plugin(t, gpuName); p.State != "Answering" {
			t.Errorf("locally, the device plugin is %s", p.State)
		}
		out, code := plugctl(t, "--socket", pd.socket, "doctor", "--min-severity", "error")
		for _, want := range []string{`plugd may not list and watch Node node-a: it lacks the permission "list, watch nodes"`,
			`lacks the permission "list, watch resourceslices.resource.k8s.io"`} {
			if code != 4 || !strings.Contains(out, want) {
				t.Errorf("plugctl doctor (%d) does not say %q:\n%s", code, want, out)
			}
		}
		if m, _ := plugctlMetrics(t, pd); !strings.Contains(m, "plugd_kubernetes_api_healthy 0") {
			t.Error("plugd_kubernetes_api_healthy is not 0")
		}
		if !strings.Contains(pd.out.String(), "Kubernetes API: cannot read") {
			t.Errorf("plugd did not log the trouble")
		}

		// Reads allowed (list and watch: plugd gets nothing by name), the
		// condition write not: the write's refusal names the permission.
		reads := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "plugd-reads"}, Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"list", "watch"}},
			{APIGroups: []string{"storage.k8s.io"}, Resources: []string{"csinodes"}, Verbs: []string{"list", "watch"}},
			{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceslices", "devicetaintrules"}, Verbs: []string{"list", "watch"}},
		}}
		if _, err := admin.RbacV1().ClusterRoles().Create(ctx, reads, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		bind(t, "plugd-reads")
		pd.waitKubelet(t, csiName, api.KubeletRegistered, "Inferred")
		k.setDevices(gpuName, 2, 0)
		pd.waitAPIFinding(t, `lacks the permission "patch nodes/status"`)
		// The plugin goes back to what the Node shows: nothing is left to
		// write, and a refused write that is no longer needed is no trouble.
		k.setDevices(gpuName, 2, 2)
		eventually(t, "the refused write forgotten once nothing needs writing", func() (bool, string) {
			out, _ := plugctl(t, "--socket", pd.socket, "doctor")
			return !strings.Contains(out, "kubernetes-api"), out
		})
		// A refused event names its permission too (the CSINode entry goes:
		// the kubelet and the socket disagree past the grace).
		k.setCSIDriver(csiName, "")
		pd.waitAPIFinding(t, `lacks the permission "create, patch events.events.k8s.io"`)
		k.setCSIDriver(csiName, node)
		k.setDevices(gpuName, 2, 0)
		admin.RbacV1().ClusterRoleBindings().Delete(ctx, "plugd-reads", metav1.DeleteOptions{})
		bind(t, "plugd")
		// Converges: the write is retried with backoff and lands.
		waitCondition(t, node, gpuCond, corev1.ConditionFalse, "NoHealthyDevices")
		k.setDevices(gpuName, 2, 2)
		waitCondition(t, node, gpuCond, corev1.ConditionTrue, "Inferred")
		eventually(t, "the doctor's Kubernetes findings gone", func() (bool, string) {
			out, _ := plugctl(t, "--socket", pd.socket, "doctor")
			return !strings.Contains(out, "kubernetes-api"), out
		})
	})

	t.Run("a plugin no longer expected takes its condition with it", func(t *testing.T) {
		// A condition in plugd's form that someone else wrote is not plugd's.
		const mimic = "example.com/Mimic"
		patch := fmt.Sprintf(`{"status":{"conditions":[{"type":%q,"status":"True","reason":"Copied","message":"plugd: CSIPlugin mimic.example.com: copied by hand"}]}}`, mimic)
		if _, err := admin.CoreV1().Nodes().Patch(context.Background(), node, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{FieldManager: "someone-else"}, "status"); err != nil {
			t.Fatal(err)
		}
		pd.stop(t)
		fewer := strings.Replace(config, "  - {type: DRAPlugin, name: "+draName+"}\n", "", 1)
		if fewer == config {
			t.Fatal("the DRA expectation is not in the configuration")
		}
		pd = startPlugd(top, dir, fewer)
		eventually(t, "the DRA driver's condition gone", func() (bool, string) {
			n := getNode(t, node)
			return condition(n, draCond) == nil && condition(n, csiCond) != nil && condition(n, "example.com/KernelDeadlock") != nil, fmt.Sprint(len(n.Status.Conditions))
		})
		if condition(getNode(t, node), mimic) == nil {
			t.Errorf("plugd deleted %s, a condition in its form that someone else wrote", mimic)
		}
		pd.stop(t)
		pd = startPlugd(top, dir, config)
		waitCondition(t, node, draCond, corev1.ConditionTrue, "Inferred")
	})

	t.Run("the API server goes away and comes back", func(t *testing.T) {
		cp.StopAPIServer()
		restarted := false
		defer func() {
			if !restarted {
				if err := cp.StartAPIServer(context.Background()); err != nil {
					t.Error(err)
				}
			}
		}()
		v := pd.waitKubelet(t, csiName, api.KubeletUnknown, "APIUnavailable")
		if !strings.Contains(v.Message, "connection refused") {
			t.Errorf("view while the API server is down: %+v", v)
		}
		// Locally everything goes on: the device plugin leaves, plugd sees it.
		gpu.Close()
		eventually(t, "the device plugin gone from plugd", func() (bool, string) {
			p := pd.plugin(t, gpuName)
			return p.ID == "", p.State
		})
		out, code := plugctl(t, "--socket", pd.socket, "list")
		if code != 0 || !strings.Contains(out, "csi.example.com-reg.sock") {
			t.Errorf("plugctl list while the API server is down (%d):\n%s", code, out)
		}
		if err := cp.StartAPIServer(context.Background()); err != nil {
			t.Fatal(err)
		}
		restarted = true
		t.Logf("kube-apiserver restarted in %s", cp.StartupTime.Round(time.Millisecond))
		pd.waitKubelet(t, csiName, api.KubeletRegistered, "Inferred")
		waitCondition(t, node, gpuCond, corev1.ConditionFalse, "SocketMissing")
		gpu = startDevicePlugin(top, reg, gpuName, 2)
		waitCondition(t, node, gpuCond, corev1.ConditionTrue, "Inferred")
	})
}

// waitAPIFinding waits until plugctl doctor has a kubernetes-api finding
// whose summary holds want.
func (p *plugd) waitAPIFinding(t *testing.T, want string) {
	t.Helper()
	eventually(t, "a kubernetes-api finding that says "+want, func() (bool, string) {
		out, _ := plugctl(t, "--socket", p.socket, "doctor", "-o", "json")
		var l api.FindingList
		decode(t, out, &l)
		for _, f := range l.Findings {
			if f.Check == "kubernetes-api" && strings.Contains(f.Summary, want) {
				return true, ""
			}
		}
		return false, out
	})
}

// bind binds the ClusterRole role to plugd's ServiceAccount.
func bind(t *testing.T, role string) {
	t.Helper()
	b := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: role},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "plugd", Namespace: "plugd"}}}
	if _, err := admin.RbacV1().ClusterRoleBindings().Create(context.Background(), b, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func plugctlMetrics(t *testing.T, pd *plugd) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := getUnix(ctx, pd.socket, "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	return out, nil
}

// quietMinute watches what plugd asks of the API server over a minute in
// which nothing changes: the API server's own request counters, and its
// audit log, which names the user. The one write allowed is the
// conditions' heartbeat, if it falls due in the minute (every heartbeat
// after the oldest of plugd's conditions on node was last written).
func quietMinute(t *testing.T, pd *plugd, node string, heartbeat time.Duration) {
	ctx := context.Background()
	var oldest time.Time
	for _, c := range getNode(t, node).Status.Conditions {
		if nodecond.Owned(c) && (oldest.IsZero() || c.LastHeartbeatTime.Time.Before(oldest)) {
			oldest = c.LastHeartbeatTime.Time
		}
	}
	before, err := cp.Get(ctx, "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	from := time.Now()
	time.Sleep(time.Minute) // the window measured, not a wait for something
	to := time.Now()
	after, err := cp.Get(ctx, "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	beats := 0
	if due := oldest.Add(heartbeat); !oldest.IsZero() && !due.Before(from.Add(-time.Second)) && due.Before(to) {
		beats = 1
		t.Logf("a heartbeat fell due in the minute, at %s", due.Format(time.RFC3339))
	}
	writes := 0
	for _, verb := range []string{"POST", "PATCH", "PUT", "DELETE"} {
		for _, res := range []string{"nodes", "events", "csinodes"} {
			d := requestDelta(before, after, verb, res)
			writes += d
			if allowed := beats * btoi(verb == "PATCH" && res == "nodes"); d > allowed {
				t.Errorf("apiserver_request_total{verb=%s,resource=%s} grew by %d over the quiet minute; want at most %d", verb, res, d, allowed)
			}
		}
	}
	byVerb, err := auditCount(plugdUser, from, to)
	if err != nil {
		t.Fatal(err)
	}
	if len(byVerb) > beats || byVerb["patch"] != beats && beats > 0 {
		t.Errorf("plugd made requests over the quiet minute: %v; want none (its watches stay open) but %d heartbeat patch", byVerb, beats)
	}
	total, err := auditCount(plugdUser, pd.started, to)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("plugd's requests by verb from its start to the end of the quiet minute (audit log): %v", total)
	// The four watches (Node, CSINode, ResourceSlices, DeviceTaintRules)
	// stream the initial state: no list, and no watch reopened.
	if total["list"] != 0 || total["watch"] != 4 {
		t.Errorf("plugd's reads from its start: %d list, %d watch; want 0 and 4", total["list"], total["watch"])
	}
	m, _ := plugctlMetrics(t, pd)
	t.Logf("quiet minute %s: apiserver_request_total writes to nodes/events/csinodes: %d; plugd's requests by verb (audit log): %v",
		to.Sub(from).Round(time.Second), writes, byVerb)
	for _, op := range []string{"patch_node_status", "remove_taint", "event"} {
		v, _ := metric(m, "plugd_kubernetes_writes_total", `operation="`+op+`"`)
		t.Logf("plugd_kubernetes_writes_total{operation=%s} = %s since start", op, v)
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// requestDelta is how much apiserver_request_total grew for verb and
// resource (every subresource, scope and code) between two scrapes.
func requestDelta(before, after, verb, resource string) int {
	sum := func(text string) int {
		n := 0
		for line := range strings.Lines(text) {
			if strings.HasPrefix(line, "apiserver_request_total{") && strings.Contains(line, `verb="`+verb+`"`) && strings.Contains(line, `resource="`+resource+`"`) {
				f := strings.Fields(line)
				v, _ := strconv.ParseFloat(f[len(f)-1], 64)
				n += int(v)
			}
		}
		return n
	}
	return sum(after) - sum(before)
}
