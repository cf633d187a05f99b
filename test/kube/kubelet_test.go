//go:build linux

package kube

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	podresv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/plugd/plugd/internal/testenv"
	"github.com/plugd/plugd/test/kube/kubelet"
)

// startKubelet runs a real kubelet for node until the test ends, and waits
// until its Node is Ready.
func startKubelet(t *testing.T, node string, taints ...string) *kubelet.Kubelet {
	t.Helper()
	if os.Geteuid() != 0 {
		skipOrFail(t, "a real kubelet needs root (a mount namespace of its own, its runtime's directories)")
	}
	dir := testenv.ShortDir(t, "kl")
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := cp.WriteNodeKubeconfig(kubeconfig, node); err != nil {
		t.Fatal(err)
	}
	k, err := kubelet.Start(context.Background(), kubelet.Config{Bin: dirs.Bin, Kubelet: kubeletBin.Path, Dir: dir, Node: node, Kubeconfig: kubeconfig,
		Taints: taints, StatusUpdate: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		k.Close()
		if t.Failed() {
			t.Logf("the kubelet's log ends:\n%s", k.Tail(60))
		}
		// The Node outlives its kubelet; the next test's is another.
		admin.CoreV1().Nodes().Delete(context.Background(), node, metav1.DeleteOptions{})
		admin.StorageV1().CSINodes().Delete(context.Background(), node, metav1.DeleteOptions{})
	})
	t.Logf("kubelet %s serving after %s", node, k.StartupTime.Round(time.Millisecond))
	waitNodeReady(t, node)
	return k
}

// skipOrFail skips the test, saying why; with PLUGD_KUBE=require, as .ci/run
// sets, it fails it instead, so that CI never passes without the real
// kubelet's tests.
func skipOrFail(t *testing.T, why string) {
	t.Helper()
	if requireAll() {
		t.Fatal(why + " (PLUGD_KUBE=require: every test must run)")
	}
	t.Skip(why)
}

// needKubelet skips the test, saying why, where the kubelet under test
// (PLUGD_KUBELET_MINOR) is older than minor: a scenario of a kubelet
// feature that minor has not. It skips even with PLUGD_KUBE=require, as the
// scenario cannot apply; docs/kubernetes.md lists each such skip.
func needKubelet(t *testing.T, minor, why string) {
	t.Helper()
	if !kubeletBin.AtLeast(minor) {
		t.Skipf("the kubelet under test is of minor %s (%s); this needs %s or newer: %s", kubeletBin.Minor, kubeletBin.Version, minor, why)
	}
}

// requireAll says PLUGD_KUBE=require is set.
func requireAll() bool { return os.Getenv("PLUGD_KUBE") == "require" }

// waitNodeReady waits until node's kubelet says it is Ready.
func waitNodeReady(t *testing.T, node string) {
	t.Helper()
	eventually(t, "Node "+node+" Ready", func() (bool, string) {
		n, err := admin.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		c := condition(n, string(corev1.NodeReady))
		if c == nil {
			return false, "no Ready condition"
		}
		return c.Status == corev1.ConditionTrue, c.Reason + ": " + c.Message
	})
}

// serviceAccountToken makes a ServiceAccount in namespace default, binds it
// to a ClusterRole with rules (none: no binding), and returns a token of it.
func serviceAccountToken(t *testing.T, name string, rules ...rbacv1.PolicyRule) string {
	t.Helper()
	ctx := context.Background()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}}
	if _, err := admin.CoreV1().ServiceAccounts("default").Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if len(rules) > 0 {
		role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules}
		if _, err := admin.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		b := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: "default"}}}
		if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, b, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	exp := int64(3600)
	tr, err := admin.CoreV1().ServiceAccounts("default").CreateToken(ctx, name,
		&authv1.TokenRequest{Spec: authv1.TokenRequestSpec{ExpirationSeconds: &exp}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

// allocatable asks the kubelet's pod-resources API for its allocatable
// devices of resource.
func allocatable(t *testing.T, socket, resource string) (int, error) {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := podresv1.NewPodResourcesListerClient(conn).GetAllocatableResources(ctx, &podresv1.AllocatableResourcesRequest{})
	if err != nil {
		return 0, err
	}
	n := 0
	for _, d := range r.Devices {
		if d.ResourceName == resource {
			n += len(d.DeviceIds)
		}
	}
	return n, nil
}

// The harness itself: a real kubelet registers its Node, serves /metrics
// to a token allowed nodes/metrics (checked by the API server through its
// webhooks) and refuses one that is not, registers a device plugin from its
// plugins_registry, reports its devices through pod-resources, restarts,
// and leaves the host as it found it.
func TestRealKubelet(t *testing.T) {
	before := kubelet.Sysctls()
	hostPaths := []string{"/var/lib/kubelet", "/var/log/pods", "/var/log/containers", "/etc/kubernetes"}
	existed := map[string]bool{}
	for _, p := range hostPaths {
		_, err := os.Lstat(p)
		existed[p] = err == nil
	}
	const node = "kubelet-smoke"
	k := startKubelet(t, node, "example.com/smoke:NoSchedule")
	n := getNode(t, node)
	if len(n.Spec.Taints) == 0 || n.Spec.Taints[0].Key != "example.com/smoke" {
		t.Errorf("the Node's taints: %+v", n.Spec.Taints)
	}

	allowed := serviceAccountToken(t, "metrics-reader", rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"nodes/metrics"}, Verbs: []string{"get"}})
	denied := serviceAccountToken(t, "no-rights")
	ctx := context.Background()
	if body, code, err := k.Get(ctx, "/metrics", denied); err != nil || code != 403 {
		t.Errorf("GET /metrics without nodes/metrics: %d, %v: %.200s", code, err, body)
	}
	body, code, err := k.Get(ctx, "/metrics", allowed)
	if err != nil || code != 200 || !strings.Contains(body, "process_start_time_seconds") {
		t.Fatalf("GET /metrics with nodes/metrics: %d, %v: %.300s", code, err, body)
	}
	t.Logf("the kubelet's /metrics: %d bytes", len(body))

	startDevicePlugin(t, k.RegistryDir, "example.com/smoke", 3)
	sock := filepath.Join(k.RegistryDir, "gpu.sock")
	eventually(t, "the kubelet registers the device plugin", func() (bool, string) {
		body, _, err := k.Get(ctx, "/metrics", allowed)
		if err != nil {
			return false, err.Error()
		}
		for line := range strings.Lines(body) {
			if strings.Contains(line, "plugin_manager_total_plugins{") && strings.Contains(line, sock) && strings.Contains(line, "actual_state_of_world") {
				t.Logf("the kubelet's metric: %s", strings.TrimSpace(line))
				return true, ""
			}
		}
		return false, "not in its actual state of world"
	})
	eventually(t, "the devices in pod-resources", func() (bool, string) {
		n, err := allocatable(t, k.PodResources, "example.com/smoke")
		return n == 3, fmt.Sprint(n, err)
	})

	pid := k.Pid()
	k.Stop()
	if err := k.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if k.Pid() == pid {
		t.Error("the kubelet did not restart")
	}
	t.Logf("kubelet restarted in %s", k.StartupTime.Round(time.Millisecond))
	waitNodeReady(t, node)
	k.Close()

	if after := kubelet.Sysctls(); !maps.Equal(before, after) {
		t.Errorf("the host's sysctls changed: before %v, after %v", before, after)
	}
	for _, p := range hostPaths {
		if _, err := os.Lstat(p); (err == nil) != existed[p] {
			t.Errorf("%s: existed before the kubelet ran: %v; now: %v", p, existed[p], err == nil)
		}
	}
}
