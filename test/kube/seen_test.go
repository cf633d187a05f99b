//go:build linux

package kube

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/plugd/plugd/api"
	"github.com/plugd/plugd/internal/testenv"
	"github.com/plugd/plugd/plugin"
	"github.com/plugd/plugd/test/kube/kubelet"
)

// kubeletPluginState says whether the kubelet's plugin manager has socket
// in its desired state (seen) and in its actual state (registered), from
// its own /metrics (kubelet_plugin_manager_total_plugins).
func kubeletPluginState(t *testing.T, k *kubelet.Kubelet, socket string) (seen, registered bool, err error) {
	t.Helper()
	body, code, err := k.Get(context.Background(), "/metrics", cp.AdminToken)
	if err != nil || code != 200 {
		return false, false, fmt.Errorf("GET /metrics: %d, %v", code, err)
	}
	in := func(state string) bool {
		return strings.Contains(body, fmt.Sprintf("plugin_manager_total_plugins{socket_path=%q,state=%q} 1", socket, state))
	}
	return in("desired_state_of_world"), in("actual_state_of_world"), nil
}

// Issue 24: a socket the real kubelet has seen and not registered (its
// desired state without its actual state) is named, with what plugd knows
// of why, in the view, the condition and plugctl doctor. The cause is one
// plugd cannot see: a ValidatingAdmissionPolicy (a cluster's policy engine,
// say) refuses the kubelet's write of the driver into this node's CSINode,
// so the kubelet fails the registration, tells the plugin registered=false
// and retries with backoff, while the registration socket and the driver
// answer plugd; the plugin (plugd's SDK, not node-driver-registrar) does
// not exit. Then the policy goes: the kubelet's next retry registers the
// socket, and the condition turns True, once.
func TestKubeletSeenNotRegistered(t *testing.T) {
	// Before v1.36 the kubelet's plugin manager put a socket in its actual
	// state before its handler's RegisterPlugin and left it there when that
	// failed, and never retried (kubernetes/kubernetes#133335, in v1.36):
	// the refused driver shows as held, and the policy's removal is never
	// taken up. docs/kubernetes.md, "Kubelet versions", says what plugd
	// makes of that kubelet.
	needKubelet(t, "1.36", "the kubelet removes a socket whose registration failed from its actual state and retries it (kubernetes/kubernetes#133335)")
	const node = "k-seen"
	k := startKubelet(t, node)
	applyManifest(t, "deploy/kubernetes/daemonset.yaml")
	dir := testenv.ShortDir(t, "ks")
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := cp.WriteKubeconfig(kubeconfig, plugdToken(t)); err != nil {
		t.Fatal(err)
	}
	conds := watchConditions(t, node, nil)
	dropPolicy := refuseCSINodeDriver(t, node, csiName)

	// The driver, and its registration socket.
	endpoint := filepath.Join(dir, "csi.sock")
	d := &csiDriver{name: csiName, nodeID: node}
	serveGRPC(t, endpoint, func(s *grpc.Server) {
		csi.RegisterIdentityServer(s, d)
		csi.RegisterNodeServer(s, d)
	})
	reg := testenv.StartPlugin(t, plugin.Config{Dir: k.RegistryDir, Socket: csiName + "-reg.sock", Type: "CSIPlugin", Name: csiName,
		Versions: []string{"1.0.0"}, Endpoint: endpoint})
	sock := reg.Path()
	// The kubelet's side, the premise: it has seen the socket, failed to
	// register it and told the plugin so, and holds it in its desired state
	// only.
	eventually(t, "the kubelet refusing the registration", func() (bool, string) {
		st, ok := reg.Status()
		return ok && !st.Registered && st.Error != "", fmt.Sprintf("%+v %v", st, ok)
	})
	st, _ := reg.Status()
	if !strings.Contains(st.Error, "ValidatingAdmissionPolicy") {
		t.Errorf("the kubelet's registered=false says %q; want the policy's refusal of its CSINode write", st.Error)
	}
	t.Logf("the kubelet told the plugin: %s", st.Error)
	eventually(t, "the kubelet's desired state with the socket, its actual state without", func() (bool, string) {
		seen, registered, err := kubeletPluginState(t, k, sock)
		return seen && !registered, fmt.Sprintf("seen %v, registered %v, %v", seen, registered, err)
	})

	pd := startPlugd(t, dir, besideKubeletConfig(k.RegistryDir, kubeconfig, node, k.Addr, k.CertFile, dir))

	// The view: the socket answers plugd, and the kubelet has seen it and
	// not registered it.
	v := pd.waitKubelet(t, csiName, api.KubeletNotRegistered, "SeenNotRegistered")
	if !strings.Contains(v.Message, "the kubelet has seen "+sock+" and not registered it") || !strings.Contains(v.Message, "refused it or cannot reach it") {
		t.Errorf("view: %+v", v)
	}
	if p := pd.plugin(t, csiName); p.State != api.StateAnswering {
		t.Errorf("plugd's own look at the plugin: %s (%s); want %s", p.State, p.LastError, api.StateAnswering)
	}
	// The condition: False, and why.
	c := waitCondition(t, node, csiCond, corev1.ConditionFalse, "KubeletNotRegistered")
	if !strings.Contains(c.Message, "its socket answers, but the kubelet has not registered it") || !strings.Contains(c.Message, "has seen "+sock) {
		t.Errorf("the condition's message: %q", c.Message)
	}
	// The doctor: the finding that the kubelet has not registered the
	// socket, with the kubelet's refusal first among the likely causes and
	// where to read its reason.
	var notRegistered api.Finding
	eventually(t, "plugctl doctor's kubelet-not-registered finding", func() (bool, string) {
		out, _ := plugctl(t, "--socket", pd.socket, "doctor", "-o", "json")
		var l api.FindingList
		decode(t, out, &l)
		notRegistered = api.Finding{}
		for _, f := range l.Findings {
			if f.Check == "kubelet-not-registered" && f.Name == csiName {
				notRegistered = f
			}
		}
		return notRegistered.Check != "", out
	})
	var causes []string
	for _, e := range notRegistered.Evidence {
		if c, ok := strings.CutPrefix(e, "likely cause: "); ok {
			causes = append(causes, c)
		}
	}
	if notRegistered.Severity != api.SeverityWarning || notRegistered.Socket != sock || !strings.Contains(notRegistered.Remedy, "likely causes") ||
		!slices.Contains(notRegistered.Evidence, "kubelet view: "+v.Message) || len(causes) < 1 ||
		!strings.HasPrefix(causes[0], "the kubelet has seen the socket and refused it, or cannot dial the plugin's endpoint") ||
		!strings.Contains(causes[0], "journalctl -u kubelet | grep "+csiName) {
		t.Errorf("kubelet-not-registered: %+v", notRegistered)
	}
	// From v1.36 each retry of the kubelet puts the socket in its actual
	// state for as long as its CSINode write takes to fail (it removes it
	// then): a read of the kubelet in that window finds it held, not in
	// CSINode (NotInCSINode) until the next read. So the doctor's text is
	// waited for too, as its JSON was.
	eventually(t, "plugctl doctor's text naming the kubelet's log", func() (bool, string) {
		out, _ := plugctl(t, "--socket", pd.socket, "doctor")
		for _, want := range []string{"kubelet-not-registered", "journalctl -u kubelet | grep " + csiName} {
			if !strings.Contains(out, want) {
				return false, fmt.Sprintf("it does not say %q:\n%s", want, out)
			}
		}
		return true, ""
	})
	// The refused plugin serves on: it was told false, and did not exit.
	if _, err := os.Stat(sock); err != nil || reg.Notifications() == 0 {
		t.Errorf("the refused plugin's socket: %v; notifications %d", err, reg.Notifications())
	}

	// Up to here the condition is False, and was written once: not True on
	// the strength of a socket that answers plugd. (The watch may trail the
	// GET: wait for it to deliver the first write.)
	if c := condition(getNode(t, node), csiCond); c == nil || c.Status != corev1.ConditionFalse {
		t.Errorf("while the kubelet refused the registration the condition is %+v", c)
	}
	eventually(t, "the watch seeing the condition False", func() (bool, string) {
		seq := conds.since(csiCond, pd.started)
		return len(seq) > 0, fmt.Sprint(seq)
	})
	if seq := conds.since(csiCond, pd.started); len(seq) != 1 || seq[0].String() != "False/KubeletNotRegistered" {
		t.Errorf("while the kubelet refused the registration the condition went %v", seq)
	}

	// The policy goes, the cause is gone: the kubelet's next retry
	// registers the socket, and the condition turns True, with nothing
	// between.
	dropPolicy()
	// The kubelet retries a failed registration with a backoff that doubles
	// up to 2m2s, keyed by the socket's path: its next try may be that far
	// off when the refusals lasted long (on a loaded machine).
	eventuallyWithin(t, 2*time.Minute+2*time.Second+wait, "the kubelet's retry registering the socket", func() (bool, string) {
		seen, registered, err := kubeletPluginState(t, k, sock)
		return registered, fmt.Sprintf("seen %v, registered %v, %v", seen, registered, err)
	})
	waitCondition(t, node, csiCond, corev1.ConditionTrue, "PluginReady")
	v = pd.waitKubelet(t, csiName, api.KubeletRegistered, "")
	if !strings.Contains(v.Message, "the kubelet's plugin manager holds "+sock) {
		t.Errorf("view once registered: %+v", v)
	}
	// The watch of the Node may trail the GET that saw True.
	var seq []string
	eventually(t, "the watch seeing the condition True", func() (bool, string) {
		seq = seq[:0]
		for _, tr := range conds.since(csiCond, pd.started) {
			seq = append(seq, tr.String())
		}
		return len(seq) > 0 && seq[len(seq)-1] == "True/PluginReady", fmt.Sprint(seq)
	})
	if !slices.Equal(seq, []string{"False/KubeletNotRegistered", "True/PluginReady"}) {
		t.Errorf("the condition went %v", seq)
	}
}

// refuseCSINodeDriver makes the API server refuse any write of node's
// CSINode that lists driver, with a ValidatingAdmissionPolicy and its
// binding, as a cluster's policy engine could; it returns once a dry-run
// of such a write is refused, having made their removal a cleanup. The
// function it returns removes them and returns once the write would be
// taken (or the kubelet has made it).
func refuseCSINodeDriver(t *testing.T, node, driver string) (drop func()) {
	t.Helper()
	ctx := context.Background()
	name := "refuse-" + node
	fail := admissionregistrationv1.Fail
	policy := &admissionregistrationv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: &fail,
			MatchConstraints: &admissionregistrationv1.MatchResources{
				ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
					RuleWithOperations: admissionregistrationv1.RuleWithOperations{
						Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
						Rule:       admissionregistrationv1.Rule{APIGroups: []string{"storage.k8s.io"}, APIVersions: []string{"v1"}, Resources: []string{"csinodes"}},
					},
				}},
			},
			Validations: []admissionregistrationv1.Validation{{
				Expression: fmt.Sprintf("object.metadata.name != %q || !has(object.spec.drivers) || !object.spec.drivers.exists(d, d.name == %q)", node, driver),
				Message:    fmt.Sprintf("this test refuses %s on %s", driver, node),
			}},
		},
	}
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        name,
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
		},
	}
	adm := admin.AdmissionregistrationV1()
	var once sync.Once
	remove := func() {
		once.Do(func() {
			for _, err := range []error{
				adm.ValidatingAdmissionPolicyBindings().Delete(ctx, name, metav1.DeleteOptions{}),
				adm.ValidatingAdmissionPolicies().Delete(ctx, name, metav1.DeleteOptions{}),
			} {
				if err != nil && !apierrors.IsNotFound(err) {
					t.Error(err)
				}
			}
		})
	}
	t.Cleanup(remove)
	if _, err := adm.ValidatingAdmissionPolicies().Create(ctx, policy, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := adm.ValidatingAdmissionPolicyBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// A dry run of the kubelet's write: the CSINode (the kubelet made it at
	// start) with the driver in it.
	refused := func() (bool, string) {
		n, err := admin.StorageV1().CSINodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		if slices.ContainsFunc(n.Spec.Drivers, func(d storagev1.CSINodeDriver) bool { return d.Name == driver }) {
			return false, "listed" // the kubelet wrote it: the policy is gone
		}
		n.Spec.Drivers = append(n.Spec.Drivers, storagev1.CSINodeDriver{Name: driver, NodeID: node})
		_, err = admin.StorageV1().CSINodes().Update(ctx, n, metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}})
		if err == nil {
			return false, "taken"
		}
		return strings.Contains(err.Error(), "ValidatingAdmissionPolicy"), err.Error()
	}
	eventually(t, "the API server refusing "+driver+" in "+node+"'s CSINode", refused)
	return func() {
		remove()
		eventually(t, "the API server taking "+driver+" in "+node+"'s CSINode again", func() (bool, string) {
			r, why := refused()
			return !r && (why == "taken" || why == "listed"), why
		})
	}
}
