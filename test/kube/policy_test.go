//go:build linux

package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/plugd/plugd/api"
	"github.com/plugd/plugd/internal/nodecond"
	"github.com/plugd/plugd/internal/testenv"
)

// policyObjects are the admission policies and bindings of a rendering,
// and the ConfigMaps that are their parameters.
type policyObjects struct {
	policies   []*admissionv1.ValidatingAdmissionPolicy
	bindings   []*admissionv1.ValidatingAdmissionPolicyBinding
	configMaps []*corev1.ConfigMap
}

// readPolicyObjects decodes the admission policies, their bindings and
// the ConfigMaps among the objects of rel, as kubectl would.
func readPolicyObjects(t *testing.T, rel string) policyObjects {
	t.Helper()
	var o policyObjects
	for _, obj := range manifestObjects(t, rel) {
		switch x := obj.(type) {
		case *admissionv1.ValidatingAdmissionPolicy:
			o.policies = append(o.policies, x)
		case *admissionv1.ValidatingAdmissionPolicyBinding:
			o.bindings = append(o.bindings, x)
		case *corev1.ConfigMap:
			o.configMaps = append(o.configMaps, x)
		}
	}
	return o
}

// configMap is the ConfigMap named name among o's.
func (o policyObjects) configMap(t *testing.T, name string) *corev1.ConfigMap {
	t.Helper()
	for _, c := range o.configMaps {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no ConfigMap %s", name)
	return nil
}

// installPolicies creates the policies, their bindings and the parameters
// params (replacing ConfigMaps of the same names) as the admin, and
// removes the policies and bindings when the test ends. The API server
// takes them up (and lets them go) a moment later: refusals counts how
// many writes that they refuse are refused (n of all), and each step
// waits for all or none, so that no later test meets them.
func installPolicies(t *testing.T, o policyObjects, refusals func() (n, all int, last string), params ...*corev1.ConfigMap) {
	t.Helper()
	ctx := context.Background()
	t.Cleanup(func() { // after the deletions below
		eventually(t, "the policies no longer in force", func() (bool, string) {
			n, all, last := refusals()
			return n == 0, fmt.Sprintf("%d of %d refused; last: %s", n, all, last)
		})
	})
	for _, c := range params {
		admin.CoreV1().ConfigMaps(c.Namespace).Delete(ctx, c.Name, metav1.DeleteOptions{})
		if _, err := admin.CoreV1().ConfigMaps(c.Namespace).Create(ctx, c, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	api := admin.AdmissionregistrationV1()
	for _, p := range o.policies {
		if _, err := api.ValidatingAdmissionPolicies().Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatalf("creating the policy %s: %v", p.Name, err)
		}
		t.Cleanup(func() { api.ValidatingAdmissionPolicies().Delete(ctx, p.Name, metav1.DeleteOptions{}) })
	}
	for _, b := range o.bindings {
		if _, err := api.ValidatingAdmissionPolicyBindings().Create(ctx, b, metav1.CreateOptions{}); err != nil {
			t.Fatalf("creating the binding %s: %v", b.Name, err)
		}
		t.Cleanup(func() { api.ValidatingAdmissionPolicyBindings().Delete(ctx, b.Name, metav1.DeleteOptions{}) })
	}
	eventually(t, "the policies in force", func() (bool, string) {
		n, all, last := refusals()
		return n == all, fmt.Sprintf("%d of %d refused; last: %s", n, all, last)
	})
}

// write is one request of a table: its name and how to make it, dry run
// or not.
type write struct {
	name string
	do   func(ctx context.Context, dryRun []string) error
}

// statusCode is the HTTP status of an API error (200 for none).
func statusCode(err error) int32 {
	var s apierrors.APIStatus
	if errors.As(err, &s) {
		return s.Status().Code
	}
	if err != nil {
		return -1
	}
	return 200
}

// patchNode returns a write that patches node (its status with sub
// "status") with c.
func patchNode(c kubernetes.Interface, node string, pt types.PatchType, patch string, sub ...string) func(context.Context, []string) error {
	return func(ctx context.Context, dryRun []string) error {
		_, err := c.CoreV1().Nodes().Patch(ctx, node, pt, []byte(patch), metav1.PatchOptions{FieldManager: nodecond.FieldManager, DryRun: dryRun}, sub...)
		return err
	}
}

// statusConditions is the strategic merge patch of a Node's status that
// sets conditions, as plugd's.
func statusConditions(t *testing.T, cs ...corev1.NodeCondition) string {
	t.Helper()
	b, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": cs}})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// recordEvent returns a write that creates e (events.k8s.io) in namespace ns.
func recordEvent(c kubernetes.Interface, ns string, e eventsv1.Event) func(context.Context, []string) error {
	return func(ctx context.Context, dryRun []string) error {
		e.GenerateName = "policy-test-"
		e.EventTime = metav1.NowMicro()
		_, err := c.EventsV1().Events(ns).Create(ctx, &e, metav1.CreateOptions{DryRun: dryRun})
		return err
	}
}

// client is a clientset with token.
func client(t *testing.T, token string) kubernetes.Interface {
	t.Helper()
	c, err := kubernetes.NewForConfig(cp.Config(token))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// podTokenOf is a token of plugd's ServiceAccount bound to its pod on
// node (made once), as the kubelet mounts it in the DaemonSet's pod: the
// API server puts the node's name in it (authentication.kubernetes.io/node-name).
func podTokenOf(t *testing.T, node string) string {
	t.Helper()
	ctx := context.Background()
	pod, err := admin.CoreV1().Pods("plugd").Get(ctx, "plugd-"+node, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		createPlugdPod(t, node)
		t.Cleanup(func() { admin.CoreV1().Pods("plugd").Delete(ctx, "plugd-"+node, *metav1.NewDeleteOptions(0)) })
		pod, err = admin.CoreV1().Pods("plugd").Get(ctx, "plugd-"+node, metav1.GetOptions{})
	}
	if err != nil {
		t.Fatal(err)
	}
	exp := int64(3600)
	tr, err := admin.CoreV1().ServiceAccounts("plugd").CreateToken(ctx, "plugd", &authv1.TokenRequest{Spec: authv1.TokenRequestSpec{
		ExpirationSeconds: &exp, BoundObjectRef: &authv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
	}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The claim, as the API server reads it back.
	r, err := client(t, tr.Status.Token).AuthenticationV1().SelfSubjectReviews().Create(ctx, &authv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Status.UserInfo.Extra["authentication.kubernetes.io/node-name"]; !slices.Equal(got, []string{node}) {
		t.Fatalf("the Pod-bound token's node-name claim is %v, want [%s]; user %+v", got, node, r.Status.UserInfo)
	}
	return tr.Status.Token
}

// caretakerToken is a token of the caretaker's ServiceAccount.
func caretakerToken(t *testing.T) string {
	t.Helper()
	exp := int64(3600)
	tr, err := admin.CoreV1().ServiceAccounts("plugd").CreateToken(context.Background(), "plugd-caretaker",
		&authv1.TokenRequest{Spec: authv1.TokenRequestSpec{ExpirationSeconds: &exp}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

// Issue 33, items 1 and 2: on a real API server, the shipped admission
// policies confine plugd's ServiceAccount to the Node its pod runs on, and
// the caretaker to marking plugd's conditions Unknown. Every write of the
// outside tester's table, which RBAC alone lets a plugd token on node A
// make (a dry run passes before the policies are installed), is refused
// (422, by the policy, in its words) once they are, while plugd's own
// writes pass: its condition, its configured taint, its event, and plugd
// itself, run with the token, makes its Node ready and removes the taint.
//
// The policies and bindings are deploy/kubernetes's; their parameters, the
// ones the chart renders from expect and removeTaintWhenReady
// (testdata/rendered/full.yaml's condition types, remove-taint-rbac.yaml's
// taint).
func TestAdmissionPolicies(t *testing.T) {
	ctx := context.Background()
	applyManifest(t, "deploy/kubernetes/daemonset.yaml")
	applyManifest(t, "deploy/kubernetes/remove-taint-rbac.yaml")
	shipped := readPolicyObjects(t, "deploy/kubernetes/daemonset.yaml")
	if len(shipped.policies) != 4 || len(shipped.bindings) != 4 {
		t.Fatalf("deploy/kubernetes/daemonset.yaml has %d policies and %d bindings, want 4 and 4", len(shipped.policies), len(shipped.bindings))
	}
	conditions := readPolicyObjects(t, "test/deploy/testdata/rendered/full.yaml").configMap(t, "plugd-admission")
	taint := readPolicyObjects(t, "deploy/kubernetes/remove-taint-rbac.yaml").configMap(t, "plugd-remove-taint")

	const a, b = "policy-a", "policy-b"
	const plugdTaint = taintKey + ":NoSchedule"
	createNode(t, a, corev1.Taint{Key: taintKey, Effect: corev1.TaintEffectNoSchedule})
	createNode(t, b, corev1.Taint{Key: "node-role.kubernetes.io/control-plane", Effect: corev1.TaintEffectNoSchedule},
		corev1.Taint{Key: taintKey, Effect: corev1.TaintEffectNoSchedule})
	t.Cleanup(func() {
		for _, n := range []string{a, b} {
			admin.CoreV1().Nodes().Delete(ctx, n, metav1.DeleteOptions{})
			admin.StorageV1().CSINodes().Delete(ctx, n, metav1.DeleteOptions{})
		}
	})
	// plugd's condition on each: True on A, False on B (which a forged
	// True would make a readiness rule untaint).
	now := time.Now().Truncate(time.Second)
	setCondition(t, a, "plugd", plugdCondition("csi.example.com", corev1.ConditionTrue, now))
	setCondition(t, b, "plugd", plugdCondition("csi.example.com", corev1.ConditionFalse, now))
	onA := client(t, podTokenOf(t, a))
	unbound := client(t, plugdToken(t))
	caretaker := client(t, caretakerToken(t))

	mine := func(status corev1.ConditionStatus) corev1.NodeCondition {
		return plugdCondition("csi.example.com", status, time.Now().Truncate(time.Second))
	}
	ready := corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionFalse, Reason: "KubeletNotReady", Message: "forged",
		LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}
	removeTaint := func(node string, i int, key string) string {
		return fmt.Sprintf(`[{"op":"test","path":"/spec/taints/%d/key","value":%q},{"op":"remove","path":"/spec/taints/%d"}]`, i, key, i)
	}
	addTaint := func(key, effect string) string {
		return fmt.Sprintf(`[{"op":"add","path":"/spec/taints/-","value":{"key":%q,"effect":%q}}]`, key, effect)
	}
	nodeEvent := func(node, controller string) eventsv1.Event {
		return eventsv1.Event{Regarding: corev1.ObjectReference{APIVersion: "v1", Kind: "Node", Name: node}, ReportingController: controller,
			ReportingInstance: controller + "-" + node, Action: "Check CSIPlugin csi.example.com", Reason: "PolicyTest", Type: corev1.EventTypeNormal, Note: "test"}
	}
	strategic, jsonPatch, merge := types.StrategicMergePatchType, types.JSONPatchType, types.MergePatchType

	// The outside tester's table, and more of the same: each is refused,
	// by the policy named, with a message that says what plugd may do.
	refused := []struct {
		write
		policy, says string
	}{
		{write{"B: remove its control-plane taint", patchNode(onA, b, jsonPatch, removeTaint(b, 0, "node-role.kubernetes.io/control-plane"))}, "plugd-node", "its own Node only"},
		{write{"B: remove plugd's configured taint", patchNode(onA, b, jsonPatch, removeTaint(b, 1, taintKey))}, "plugd-node", "its own Node only"},
		{write{"B: add a NoExecute taint", patchNode(onA, b, jsonPatch, addTaint("example.com/evict", "NoExecute"))}, "plugd-node", "its own Node only"},
		{write{"B: cordon", patchNode(onA, b, merge, `{"spec":{"unschedulable":true}}`)}, "plugd-node", "its own Node only"},
		{write{"B: label", patchNode(onA, b, merge, `{"metadata":{"labels":{"node-restriction.kubernetes.io/pci":"true"}}}`)}, "plugd-node", "its own Node only"},
		{write{"A: label its own Node", patchNode(onA, a, merge, `{"metadata":{"labels":{"node-restriction.kubernetes.io/pci":"true"}}}`)}, "plugd-node", "labels, annotations"},
		{write{"A: annotate its own Node", patchNode(onA, a, merge, `{"metadata":{"annotations":{"example.com/x":"y"}}}`)}, "plugd-node", "labels, annotations"},
		{write{"A: cordon its own Node", patchNode(onA, a, merge, `{"spec":{"unschedulable":true}}`)}, "plugd-node", "not unschedulable"},
		{write{"A: add a NoExecute taint to its own Node", patchNode(onA, a, jsonPatch, addTaint("example.com/evict", "NoExecute"))}, "plugd-node", "only the taint its configuration names (" + plugdTaint},
		{write{"A: its taint key with another effect", patchNode(onA, a, jsonPatch, addTaint(taintKey, "NoExecute"))}, "plugd-node", "only the taint its configuration names"},
		{write{"B status: plugd's condition forged True", patchNode(onA, b, strategic, statusConditions(t, mine(corev1.ConditionTrue)), "status")}, "plugd-node-status", "its own Node only"},
		{write{"B status: Ready=False", patchNode(onA, b, strategic, statusConditions(t, ready), "status")}, "plugd-node-status", "its own Node only"},
		{write{"B status: allocatable 8 nvidia.com/gpu", patchNode(onA, b, strategic, `{"status":{"allocatable":{"nvidia.com/gpu":"8"},"capacity":{"nvidia.com/gpu":"8"}}}`, "status")}, "plugd-node-status", "its own Node only"},
		{write{"B status: addresses", patchNode(onA, b, strategic, `{"status":{"addresses":[{"type":"InternalIP","address":"10.9.9.9"}]}}`, "status")}, "plugd-node-status", "its own Node only"},
		{write{"A status: Ready=False", patchNode(onA, a, strategic, statusConditions(t, ready), "status")}, "plugd-node-status", "only its own Node conditions (csi.example.com/CSIPluginReady"},
		{write{"A status: another's condition removed", patchNode(onA, a, strategic, `{"status":{"conditions":[{"type":"example.com/KernelDeadlock","$patch":"delete"}]}}`, "status")}, "plugd-node-status", "only its own Node conditions"},
		{write{"A status: allocatable 8 nvidia.com/gpu", patchNode(onA, a, strategic, `{"status":{"allocatable":{"nvidia.com/gpu":"8"},"capacity":{"nvidia.com/gpu":"8"}}}`, "status")}, "plugd-node-status", "not Ready's, capacity, allocatable"},
		{write{"A status: addresses", patchNode(onA, a, strategic, `{"status":{"addresses":[{"type":"InternalIP","address":"10.9.9.9"}]}}`, "status")}, "plugd-node-status", "not Ready's, capacity, allocatable"},
		{write{"event in kube-system posing as kube-scheduler", recordEvent(onA, "kube-system", eventsv1.Event{
			Regarding: corev1.ObjectReference{APIVersion: "v1", Kind: "Pod", Namespace: "kube-system", Name: "etcd-0"}, ReportingController: "default-scheduler",
			ReportingInstance: "default-scheduler-x", Action: "Binding", Reason: "Scheduled", Type: corev1.EventTypeNormal, Note: "forged"})}, "plugd-events", "only in its namespace plugd"},
		{write{"event about node B", recordEvent(onA, "default", nodeEvent(b, "plugd"))}, "plugd-events", "about its own Node (policy-a)"},
		{write{"event about its Node, as another component", recordEvent(onA, "default", nodeEvent(a, "node-controller"))}, "plugd-events", "as reporting controller plugd"},
		{write{"unbound token: its condition", patchNode(unbound, a, strategic, statusConditions(t, mine(corev1.ConditionTrue)), "status")}, "plugd-node-status", "carries no node name"},
		{write{"unbound token: an event about a Node", recordEvent(unbound, "default", nodeEvent(a, "plugd"))}, "plugd-events", "none: its token carries no node name"},
		{write{"caretaker: plugd's condition True", patchNode(caretaker, b, strategic, statusConditions(t, mine(corev1.ConditionTrue)), "status")}, "plugd-caretaker", "to Unknown only"},
		{write{"caretaker: Ready=False", patchNode(caretaker, b, strategic, statusConditions(t, ready), "status")}, "plugd-caretaker", "may change only plugd conditions"},
		{write{"caretaker: Ready=Unknown", patchNode(caretaker, b, strategic, statusConditions(t, corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionUnknown,
			Reason: "NodeStatusUnknown", LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}), "status")}, "plugd-caretaker", "may change only plugd conditions"},
		{write{"caretaker: allocatable", patchNode(caretaker, b, strategic, `{"status":{"allocatable":{"nvidia.com/gpu":"8"}}}`, "status")}, "plugd-caretaker", "may change only plugd's conditions"},
	}
	// What RBAC alone refuses the caretaker (it may not patch Nodes), and
	// the policy would too.
	forbidden := []write{
		{"caretaker: remove a taint", patchNode(caretaker, b, jsonPatch, removeTaint(b, 1, taintKey))},
		{"caretaker: label", patchNode(caretaker, b, merge, `{"metadata":{"labels":{"node-restriction.kubernetes.io/pci":"true"}}}`)},
	}

	t.Run("without the policies RBAC lets them through", func(t *testing.T) {
		for _, w := range refused {
			if err := w.do(ctx, []string{metav1.DryRunAll}); err != nil {
				t.Errorf("%s, dry run, no policy: %v (status %d)", w.name, err, statusCode(err))
			}
		}
	})

	// plugd on A, with its Pod-bound token, expecting a CSI driver that
	// is not there yet (so that it leaves its taint alone).
	dir := testenv.ShortDir(t, "kube")
	reg := filepath.Join(dir, "plugins_registry")
	for _, d := range []string{reg, filepath.Join(dir, "plugins")} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := cp.WriteKubeconfig(kubeconfig, podTokenOf(t, a)); err != nil {
		t.Fatal(err)
	}
	config := fmt.Sprintf(`mode: observe
registryDir: %s
handlers: [{type: CSIPlugin, handler: csi}]
kubernetes: {kubeconfig: %s, nodeName: %s, removeTaintWhenReady: %q, kubelet: {address: none}}
expect: [{type: CSIPlugin, name: %s}]
doctor: {kubeletRoots: [], procDir: none}
`, reg, kubeconfig, a, plugdTaint, csiName)
	finding := func(t *testing.T, pd *plugd) (api.Finding, bool) {
		out, _ := plugctl(t, "--socket", pd.socket, "doctor", "-o", "json")
		var l api.FindingList
		decode(t, out, &l)
		i := slices.IndexFunc(l.Findings, func(f api.Finding) bool { return f.Check == "admission-policy" })
		if i < 0 {
			return api.Finding{}, false
		}
		return l.Findings[i], true
	}

	t.Run("without the policies plugctl doctor says so", func(t *testing.T) {
		pd := startPlugd(t, dir, config)
		defer pd.stop(t)
		f, ok := finding(t, pd)
		if !ok || f.Severity != api.SeverityWarning || !strings.Contains(f.Summary, "no admission policy confines plugd's ServiceAccount") ||
			!strings.Contains(f.Remedy, "admissionPolicy.enabled") {
			t.Errorf("plugctl doctor's admission-policy finding: %+v, %v", f, ok)
		}
	})

	// How many writes of the table the API server refuses, in a dry run:
	// all with the policies in force, none without.
	refusals := func() (n, all int, last string) {
		for _, w := range refused {
			if err := w.do(ctx, []string{metav1.DryRunAll}); statusCode(err) == 422 {
				n++
				last = err.Error()
			}
		}
		return n, len(refused), last
	}
	installPolicies(t, shipped, refusals, conditions, taint)

	t.Run("refused", func(t *testing.T) {
		before := map[string]*corev1.Node{a: getNode(t, a), b: getNode(t, b)}
		for _, w := range refused {
			err := w.do(ctx, nil)
			if code := statusCode(err); code != 422 || !strings.Contains(err.Error(), "ValidatingAdmissionPolicy '"+w.policy+"'") || !strings.Contains(err.Error(), w.says) {
				t.Errorf("%s: status %d, %v; want 422 from the policy %s saying %q", w.name, code, err, w.policy, w.says)
			}
		}
		for _, w := range forbidden {
			if err := w.do(ctx, nil); statusCode(err) != 403 {
				t.Errorf("%s: %v (status %d), want 403", w.name, err, statusCode(err))
			}
		}
		for n, was := range before {
			if now := getNode(t, n); now.ResourceVersion != was.ResourceVersion {
				t.Errorf("node %s was written: %+v", n, now)
			}
		}
	})

	t.Run("plugd's own writes pass", func(t *testing.T) {
		for _, w := range []write{
			{"its condition True on A", patchNode(onA, a, strategic, statusConditions(t, mine(corev1.ConditionTrue)), "status")},
			{"its condition removed on A", patchNode(onA, a, strategic, `{"status":{"conditions":[{"type":"csi.example.com/CSIPluginReady","$patch":"delete"}]}}`, "status")},
			{"its condition False on A", patchNode(onA, a, strategic, statusConditions(t, mine(corev1.ConditionFalse)), "status")}, // plugd makes it True below
			{"its taint removed from A", patchNode(onA, a, jsonPatch, removeTaint(a, 0, taintKey))},
			{"its taint added to A", patchNode(onA, a, jsonPatch, addTaint(taintKey, "NoSchedule"))},
			{"its event about A", recordEvent(onA, "default", nodeEvent(a, "plugd"))},
			{"an event in its namespace", recordEvent(onA, "plugd", eventsv1.Event{Regarding: corev1.ObjectReference{APIVersion: "v1", Kind: "Pod", Namespace: "plugd", Name: "plugd-" + a},
				ReportingController: "plugd", ReportingInstance: "plugd-" + a, Action: "Test", Reason: "PolicyTest", Type: corev1.EventTypeNormal, Note: "test"})},
			{"caretaker: plugd's condition Unknown on B", patchNode(caretaker, b, strategic, statusConditions(t, mine(corev1.ConditionUnknown)), "status")},
		} {
			if err := w.do(ctx, nil); err != nil {
				t.Errorf("%s: %v (status %d)", w.name, err, statusCode(err))
			}
		}
		if c := condition(getNode(t, b), "csi.example.com/CSIPluginReady"); c == nil || c.Status != corev1.ConditionUnknown {
			t.Errorf("the caretaker's Unknown on B: %+v", c)
		}
	})

	// plugd itself, under the policies: its condition, its event, its
	// taint removed; its doctor finds it confined, and its token refused
	// whole without the node name.
	t.Run("plugd under the policies", func(t *testing.T) {
		pd := startPlugd(t, dir, config)
		defer pd.stop(t)
		startCSI(t, reg, filepath.Join(dir, "plugins"), csiName, a)
		apiKubelet{t, a}.setCSIDriver(csiName, a)
		waitCondition(t, a, csiCond, corev1.ConditionTrue, "Inferred")
		eventually(t, "plugd's taint removed from A", func() (bool, string) {
			var keys []string
			for _, tt := range getNode(t, a).Spec.Taints {
				keys = append(keys, tt.Key)
			}
			return !slices.Contains(keys, taintKey), fmt.Sprint(keys)
		})
		if ev := waitEvent(t, a, "PluginReady", "CSIPlugin "+csiName); ev.ReportingController != "plugd" {
			t.Errorf("event %+v", ev)
		}
		if f, ok := finding(t, pd); ok {
			t.Errorf("plugctl doctor, confined: %+v", f)
		}
		if out, _ := plugctl(t, "--socket", pd.socket, "doctor"); strings.Contains(out, "kubernetes-api") {
			t.Errorf("plugctl doctor finds trouble with the API:\n%s", out)
		}
	})

	t.Run("plugd with a token without the node name", func(t *testing.T) {
		if err := cp.WriteKubeconfig(kubeconfig, plugdToken(t)); err != nil {
			t.Fatal(err)
		}
		pd := startPlugd(t, dir, config)
		defer pd.stop(t)
		f, ok := finding(t, pd)
		if !ok || f.Severity != api.SeverityError || !strings.Contains(f.Summary, "carries no node name") {
			t.Errorf("plugctl doctor's admission-policy finding: %+v, %v", f, ok)
		}
	})
	// Everyone else's writes of Nodes pass under the policies (here the
	// admin's, as a cordon, a label, a kubelet's Ready would), and still
	// pass once the policies' ConfigMaps are gone: the API server looks a
	// binding's parameter up before it reads matchConditions, so a
	// parameter that refused when missing would refuse every kubelet's
	// heartbeat. Without them plugd is confined by RBAC alone: that its
	// write to B passes is the sign the API server saw them go.
	t.Run("others' writes pass, with the parameters and without", func(t *testing.T) {
		others := []write{
			{"cordon B", patchNode(admin, b, strategic, `{"spec":{"unschedulable":true}}`)},
			{"label B", patchNode(admin, b, strategic, `{"metadata":{"labels":{"example.com/policy-test":"x"}}}`)},
			{"a kubelet's Ready on B", patchNode(admin, b, strategic, statusConditions(t, corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady"}), "status")},
		}
		passing := func(ws ...write) (bool, string) {
			for _, w := range ws {
				if err := w.do(ctx, []string{metav1.DryRunAll}); err != nil {
					return false, w.name + ": " + err.Error()
				}
			}
			return true, "all pass"
		}
		if ok, why := passing(others...); !ok {
			t.Fatalf("under the policies, %s", why)
		}
		for _, c := range []*corev1.ConfigMap{conditions, taint} {
			if err := admin.CoreV1().ConfigMaps(c.Namespace).Delete(ctx, c.Name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		sign := []write{
			{"plugd's condition on B", patchNode(onA, b, strategic, statusConditions(t, mine(corev1.ConditionTrue)), "status")},
			{"plugd's taint on B", patchNode(onA, b, jsonPatch, addTaint("example.com/policy-test", "NoExecute"))},
		}
		eventually(t, "the parameters gone, and every write of the others passing", func() (bool, string) {
			return passing(append(others, sign...)...)
		})
	})
}
