//go:build linux

package kube

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/plugd/plugd/api"
	"github.com/plugd/plugd/internal/testenv"
)

// besideKubeletConfig is plugd's configuration in observe mode beside the
// real kubelet at addr, verifying it with caFile, expecting the CSI driver.
func besideKubeletConfig(reg, kubeconfig, node, addr, caFile, dir string) string {
	return fmt.Sprintf(`mode: observe
registryDir: %s
handlers: [{type: CSIPlugin, handler: csi}]
kubernetes:
  kubeconfig: %s
  nodeName: %s
  kubelet: {address: %q, caFile: %s}
expect:
  - {type: CSIPlugin, name: %s}
doctor: {kubeletRoots: [%s], procDir: none}
`, reg, kubeconfig, node, addr, caFile, csiName, filepath.Join(dir, "none"))
}

// kubeletUnreadable is plugd's doctor finding about the kubelet it cannot
// read, once it has one.
func (p *plugd) kubeletUnreadable(t *testing.T) api.Finding {
	t.Helper()
	var f api.Finding
	eventually(t, "plugctl doctor's kubelet-unreadable finding", func() (bool, string) {
		out, _ := plugctl(t, "--socket", p.socket, "doctor", "-o", "json")
		var l api.FindingList
		decode(t, out, &l)
		i := slices.IndexFunc(l.Findings, func(f api.Finding) bool { return f.Check == "kubelet-unreadable" })
		if i < 0 {
			return false, out
		}
		f = l.Findings[i]
		return true, ""
	})
	return f
}

// checkInferred checks that plugd, unable to read the kubelet for reason,
// says what it says from the API objects alone, and that only: the view
// Registered with reason Inferred and why, never the kubelet's own word;
// the condition True with reason Inferred, not PluginReady;
// plugd_kubelet_live 0.
func checkInferred(t *testing.T, pd *plugd, node, reason string) {
	t.Helper()
	v := pd.waitKubelet(t, csiName, api.KubeletRegistered, "Inferred")
	if !strings.Contains(v.Message, "inferred from API objects, which outlive the kubelet's registrations: plugd cannot read the kubelet's own state, "+reason) ||
		strings.Contains(v.Message, "plugin manager holds") {
		t.Errorf("view: %+v", v)
	}
	c := waitCondition(t, node, csiCond, corev1.ConditionTrue, "Inferred")
	if !strings.Contains(c.Message, "inferred from API objects: plugd cannot read the kubelet's own state") {
		t.Errorf("the condition's message: %q", c.Message)
	}
	m, _ := plugctlMetrics(t, pd)
	if live, _ := metric(m, "plugd_kubelet_live"); live != "0" {
		t.Errorf("plugd_kubelet_live = %q; want 0", live)
	}
}

// Issue 24: where plugd cannot read the real kubelet, it falls back to
// inferring from the API objects, says so (Inferred) in the view and the
// condition, never claims the kubelet's own word, and plugctl doctor
// names what fixes it: the permission get nodes/metrics, which the real
// kubelet checks with the real API server (SubjectAccessReview), for a
// ServiceAccount bound to the shipped ClusterRole without it; the CA
// setting (kubernetes.kubelet.caFile) for a CA that did not sign the
// kubelet's certificate.
func TestKubeletUnreadable(t *testing.T) {
	const node = "k-unreadable"
	k := startKubelet(t, node)
	applyManifest(t, "deploy/kubernetes/daemonset.yaml")
	dir := testenv.ShortDir(t, "ku")
	conds := watchConditions(t, node, nil)
	// The CSI driver, registered by the kubelet: CSINode lists it, so the
	// inference says registered, and here rightly.
	startCSI(t, k.RegistryDir, dir, csiName, node)
	sock := filepath.Join(k.RegistryDir, csiName+"-reg.sock")
	eventually(t, "the kubelet registering the CSI driver", func() (bool, string) {
		_, registered, err := kubeletPluginState(t, k, sock)
		return registered, fmt.Sprint(err)
	})

	t.Run("the shipped ClusterRole without nodes/metrics: Forbidden", func(t *testing.T) {
		shipped, err := admin.RbacV1().ClusterRoles().Get(context.Background(), "plugd", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		rules := slices.DeleteFunc(slices.Clone(shipped.Rules), func(r rbacv1.PolicyRule) bool { return slices.Contains(r.Resources, "nodes/metrics") })
		if len(rules) == len(shipped.Rules) {
			t.Fatalf("the shipped ClusterRole plugd does not grant nodes/metrics: %+v", shipped.Rules)
		}
		token := serviceAccountToken(t, "plugd-no-metrics", rules...)
		// The premise: the kubelet refuses the token its /metrics.
		if body, code, err := k.Get(context.Background(), "/metrics", token); err != nil || code != 403 {
			t.Fatalf("the kubelet's /metrics to a token without nodes/metrics: %d, %v: %.200s", code, err, body)
		}
		pdir := testenv.ShortDir(t, "kf")
		kubeconfig := filepath.Join(pdir, "kubeconfig")
		if err := cp.WriteKubeconfig(kubeconfig, token); err != nil {
			t.Fatal(err)
		}
		pd := startPlugd(t, pdir, besideKubeletConfig(k.RegistryDir, kubeconfig, node, k.Addr, k.CertFile, pdir))
		checkInferred(t, pd, node, "KubeletForbidden")
		f := pd.kubeletUnreadable(t)
		if f.Severity != api.SeverityWarning || !strings.Contains(f.Summary, "(KubeletForbidden)") ||
			!strings.Contains(f.Remedy, `grant plugd's ServiceAccount "get nodes/metrics"`) || !strings.Contains(f.Remedy, "deploy/kubernetes/daemonset.yaml") ||
			!strings.Contains(strings.Join(f.Evidence, "\n"), `plugd lacks the permission "get nodes/metrics"`) {
			t.Errorf("finding: %+v", f)
		}
		out, _ := plugctl(t, "--socket", pd.socket, "doctor")
		if !strings.Contains(out, "kubelet-unreadable") || !strings.Contains(out, "get nodes/metrics") {
			t.Errorf("plugctl doctor:\n%s", out)
		}

		// No more than the evidence: the kubelet stopped is no kubelet,
		// whatever CSINode still lists (plugd's held connection to it
		// closes; its token is refused only once it is past TLS).
		from := pd.started
		k.Stop()
		waitCondition(t, node, csiCond, corev1.ConditionFalse, "KubeletNotRegistered")
		v := pd.waitKubelet(t, csiName, api.KubeletNotRegistered, "KubeletNotRunning")
		t.Logf("the kubelet stopped: %s", v.Message)
		if err := k.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		checkInferred(t, pd, node, "KubeletForbidden")
		var seq []string
		eventually(t, "the watch seeing the condition True again", func() (bool, string) {
			seq = seq[:0]
			for _, tr := range conds.since(csiCond, from) {
				seq = append(seq, tr.String())
			}
			return len(seq) > 0 && seq[len(seq)-1] == "True/Inferred" && slices.Contains(seq, "False/KubeletNotRegistered"), fmt.Sprint(seq)
		})
		if !slices.Equal(seq, []string{"True/Inferred", "False/KubeletNotRegistered", "True/Inferred"}) {
			t.Errorf("the condition went %v", seq)
		}
	})

	t.Run("a CA that did not sign the kubelet's certificate: TLS", func(t *testing.T) {
		pdir := testenv.ShortDir(t, "kf")
		kubeconfig := filepath.Join(pdir, "kubeconfig")
		if err := cp.WriteKubeconfig(kubeconfig, plugdToken(t)); err != nil {
			t.Fatal(err)
		}
		// The API server's CA: right for the API server, wrong for the
		// kubelet, whose serving certificate is self-signed.
		wrongCA := filepath.Join(pdir, "api-ca.crt")
		if err := os.WriteFile(wrongCA, cp.CA, 0o600); err != nil {
			t.Fatal(err)
		}
		pd := startPlugd(t, pdir, besideKubeletConfig(k.RegistryDir, kubeconfig, node, k.Addr, wrongCA, pdir))
		checkInferred(t, pd, node, "KubeletTLS")
		f := pd.kubeletUnreadable(t)
		if f.Severity != api.SeverityWarning || !strings.Contains(f.Summary, "(KubeletTLS)") ||
			!strings.Contains(f.Remedy, "set kubernetes.kubelet.caFile to it") ||
			!strings.Contains(strings.Join(f.Evidence, "\n"), "cannot verify the kubelet at "+k.Addr) {
			t.Errorf("finding: %+v", f)
		}
		out, _ := plugctl(t, "--socket", pd.socket, "doctor")
		if !strings.Contains(out, "kubelet-unreadable") || !strings.Contains(out, "kubernetes.kubelet.caFile") {
			t.Errorf("plugctl doctor:\n%s", out)
		}
	})
}
