//go:build linux

package kube

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/plugd/plugd/api"
	"github.com/plugd/plugd/internal/nodecond"
	"github.com/plugd/plugd/internal/testenv"
)

// kubectlPlugd runs the kubectl plugin and returns its output and exit code.
func kubectlPlugd(t *testing.T, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	out, err := exec.CommandContext(ctx, filepath.Join(dirs.Bin, "kubectl-plugd"), args...).CombinedOutput()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return string(out), ee.ExitCode()
	}
	if err != nil {
		t.Fatal(err)
	}
	return string(out), 0
}

// Two nodes with plugd, one with the CSI driver plugd expects and one
// without, and a plugd pod on the first that is crash-looping: kubectl
// plugd cluster, node (once and --watch) and doctor read them through the
// real API server, with kubectl's connection flags (a kubeconfig with two
// contexts, one of them wrong).
func TestKubectlPlugd(t *testing.T) {
	applyManifest(t, "deploy/kubernetes/daemonset.yaml")
	token := plugdToken(t)
	const driver = "csi.kubectl.example.com"
	const label = "plugd.test/suite=kubectl"
	cond := driver + "/CSIPluginReady"
	base := testenv.ShortDir(t, "kctl")

	// The user's kubeconfig: the admin in context "test", and a context
	// "broken" pointing at a port nobody serves; the current one is broken,
	// so that every command must take --context.
	kcfg := filepath.Join(base, "admin.kubeconfig")
	if err := cp.WriteKubeconfig(kcfg, cp.AdminToken); err != nil {
		t.Fatal(err)
	}
	c, err := clientcmd.LoadFromFile(kcfg)
	if err != nil {
		t.Fatal(err)
	}
	var ctxName string
	for name := range c.Contexts {
		ctxName = name
	}
	c.Clusters["broken"] = &clientcmdapi.Cluster{Server: "https://127.0.0.1:1"}
	c.Contexts["broken"] = &clientcmdapi.Context{Cluster: "broken", AuthInfo: c.Contexts[ctxName].AuthInfo}
	c.CurrentContext = "broken"
	if err := clientcmd.WriteToFile(*c, kcfg); err != nil {
		t.Fatal(err)
	}
	flags := []string{"--kubeconfig", kcfg, "--context", ctxName}

	for i, n := range []struct {
		name   string
		plugin bool
	}{{"kp-1", true}, {"kp-2", false}} {
		createNode(t, n.name)
		labelNode(t, n.name, label)
		dir := filepath.Join(base, fmt.Sprint(i))
		reg := filepath.Join(dir, "reg")
		if err := os.MkdirAll(reg, 0o750); err != nil {
			t.Fatal(err)
		}
		kubeconfig := filepath.Join(dir, "kubeconfig")
		if err := cp.WriteKubeconfig(kubeconfig, token); err != nil {
			t.Fatal(err)
		}
		if n.plugin {
			startCSI(t, reg, dir, driver, n.name)
			apiKubelet{t, n.name}.setCSIDriver(driver, n.name)
		}
		startPlugd(t, dir, fmt.Sprintf("mode: observe\nregistryDir: %s\nhandlers: [{type: CSIPlugin, handler: csi}]\nliveness: {probeInterval: 300ms}\n"+
			"kubernetes: {kubeconfig: %s, nodeName: %s, kubelet: {address: none}}\nexpect: [{type: CSIPlugin, name: %s}]\n", reg, kubeconfig, n.name, driver))
	}
	// No kubelet runs here (the test plays its API side): True is inferred.
	waitCondition(t, "kp-1", cond, corev1.ConditionTrue, "Inferred")
	waitCondition(t, "kp-2", cond, corev1.ConditionFalse, "SocketMissing")
	createPlugdPod(t, "kp-1")

	t.Run("cluster", func(t *testing.T) {
		out, code := kubectlPlugd(t, append([]string{"cluster", "-l", label}, flags...)...)
		if code != 0 || !regexpMatch(`CSIPlugin\s+`+driver+`\s+1\s+2\s+`+cond, out) || !strings.Contains(out, "2 nodes, 2 with plugd's conditions") {
			t.Errorf("kubectl plugd cluster -l (%d):\n%s", code, out)
		}
		t.Logf("kubectl plugd cluster:\n%s", out)
		out, _ = kubectlPlugd(t, append([]string{"cluster", "-l", label, "-o", "wide"}, flags...)...)
		if !regexpMatch(`kp-2\s+False\s+SocketMissing`, out) {
			t.Errorf("kubectl plugd cluster -o wide:\n%s", out)
		}
		out, _ = kubectlPlugd(t, append([]string{"cluster", "-l", label, "-o", "json"}, flags...)...)
		var v nodecond.ClusterView
		decode(t, out, &v)
		if v.Nodes != 2 || len(v.Plugins) != 1 || v.Plugins[0].Ready != 1 || v.Plugins[0].NotReady[0].Node != "kp-2" {
			t.Errorf("kubectl plugd cluster -o json: %+v", v)
		}
		out, _ = kubectlPlugd(t, append([]string{"cluster", "-l", label, "-o", "yaml"}, flags...)...)
		if !strings.Contains(out, "nodesWithPlugd: 2") {
			t.Errorf("kubectl plugd cluster -o yaml:\n%s", out)
		}
		// The current context of the kubeconfig is the broken one.
		if out, code := kubectlPlugd(t, "cluster", "--kubeconfig", kcfg, "--request-timeout", "5s"); code != 1 || !strings.Contains(out, "127.0.0.1:1") {
			t.Errorf("the broken context (%d):\n%s", code, out)
		}
		if out, code := kubectlPlugd(t, append([]string{"cluster", "-o", "xml"}, flags...)...); code != 2 || !strings.Contains(out, `"xml" must be one of`) {
			t.Errorf("-o xml (%d):\n%s", code, out)
		}
	})

	t.Run("node", func(t *testing.T) {
		out, code := kubectlPlugd(t, append([]string{"node", "kp-2", "-o", "wide"}, flags...)...)
		if code != 0 || !regexpMatch(`CSIPlugin\s+`+driver+`\s+False\s+SocketMissing\s+\S+\s+`+cond, out) || !strings.Contains(out, "CSI drivers (CSINode):       none") {
			t.Errorf("kubectl plugd node kp-2 -o wide (%d):\n%s", code, out)
		}
		t.Logf("kubectl plugd node kp-2 -o wide:\n%s", out)
		out, _ = kubectlPlugd(t, append([]string{"node", "kp-1", "-o", "json"}, flags...)...)
		var v struct {
			Node    string
			Ready   string
			Plugins []struct{ Type, Name, Status, Reason string }
			Kubelet struct {
				CSIDrivers []struct{ Name, NodeID string }
			}
		}
		decode(t, out, &v)
		if v.Node != "kp-1" || v.Ready != "True" || len(v.Plugins) != 1 || v.Plugins[0].Status != "True" ||
			len(v.Kubelet.CSIDrivers) != 1 || v.Kubelet.CSIDrivers[0].Name != driver || v.Kubelet.CSIDrivers[0].NodeID != "kp-1" {
			t.Errorf("kubectl plugd node kp-1 -o json: %+v", v)
		}
		if out, code := kubectlPlugd(t, append([]string{"node", "nope"}, flags...)...); code != 1 || !strings.Contains(out, `"nope" not found`) {
			t.Errorf("an unknown node (%d):\n%s", code, out)
		}
		if out, code := kubectlPlugd(t, append([]string{"node"}, flags...)...); code != 2 || !strings.Contains(out, "takes one NODE") {
			t.Errorf("no node (%d):\n%s", code, out)
		}
	})

	t.Run("watch", func(t *testing.T) {
		cmd := exec.Command(filepath.Join(dirs.Bin, "kubectl-plugd"), append([]string{"node", "kp-1", "--watch"}, flags...)...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = cmd.Stdout
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer cmd.Process.Kill()
		lines := make(chan string)
		go func() {
			defer close(lines)
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				lines <- sc.Text()
			}
			io.Copy(io.Discard, stdout)
		}()
		expectLine := func(what string) {
			t.Helper()
			deadline := time.After(wait)
			for {
				select {
				case l, ok := <-lines:
					if !ok {
						t.Fatalf("kubectl plugd node --watch ended before printing %q", what)
					}
					if regexpMatch(what, l) {
						return
					}
				case <-deadline:
					t.Fatalf("kubectl plugd node --watch printed no %q within %s", what, wait)
				}
			}
		}
		expectLine(`CSIPlugin\s+` + driver + `\s+True\s+Inferred`)
		// The kubelet lets the driver go: plugd's condition turns False,
		// and the watch prints the node again.
		apiKubelet{t, "kp-1"}.setCSIDriver(driver, "")
		expectLine(`CSIPlugin\s+` + driver + `\s+False\s+KubeletNotRegistered`)
		apiKubelet{t, "kp-1"}.setCSIDriver(driver, "kp-1")
		expectLine(`CSIPlugin\s+` + driver + `\s+True\s+Inferred`)
		cmd.Process.Signal(os.Interrupt)
		for range lines {
		}
		if err := cmd.Wait(); err != nil {
			t.Errorf("kubectl plugd node --watch after Ctrl-C: %v", err)
		}
	})

	t.Run("doctor", func(t *testing.T) {
		out, code := kubectlPlugd(t, append([]string{"doctor", "kp-2"}, flags...)...)
		for _, want := range []string{"ERROR  plugin-not-ready  CSIPlugin " + driver, "expected plugin not ready (SocketMissing)",
			"remedy: the plugin's node pod is not running here", "ERROR  plugd-not-running", "no plugd pod (app.kubernetes.io/name=plugd) in namespace plugd"} {
			if !strings.Contains(out, want) {
				t.Errorf("kubectl plugd doctor kp-2 does not say %q:\n%s", want, out)
			}
		}
		if code != 4 {
			t.Errorf("kubectl plugd doctor kp-2: exit %d, want 4", code)
		}
		t.Logf("kubectl plugd doctor kp-2:\n%s", out)

		out, code = kubectlPlugd(t, append([]string{"doctor", "kp-1", "-o", "json", "--report-timeout", "5s"}, flags...)...)
		var l api.FindingList
		decode(t, out, &l)
		checks := map[string]api.Finding{}
		for _, f := range l.Findings {
			checks[f.Check] = f
		}
		if f, ok := checks["plugd-not-ready"]; code != 4 || !ok || !strings.Contains(strings.Join(f.Evidence, " "), "CrashLoopBackOff") {
			t.Errorf("kubectl plugd doctor kp-1 (%d): %+v", code, l.Findings)
		}
		// The pod has no IP the API server may proxy to: plugd's own report
		// is out of reach, and the doctor says how to read it on the node.
		if f, ok := checks["report-unreachable"]; !ok || !strings.Contains(f.Remedy, "plugctl --socket /run/plugd/plugd.sock doctor") {
			t.Errorf("kubectl plugd doctor kp-1 -o json: no report-unreachable finding: %+v", l.Findings)
		}
		if _, ok := checks["plugin-not-ready"]; ok {
			t.Errorf("kubectl plugd doctor kp-1: its plugin is ready: %+v", l.Findings)
		}
	})
}

// labelNode adds a label (KEY=VALUE) to a node.
func labelNode(t *testing.T, node, label string) {
	t.Helper()
	k, v, _ := strings.Cut(label, "=")
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, k, v)
	if _, err := admin.CoreV1().Nodes().Patch(context.Background(), node, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// createPlugdPod creates the pod of plugd's DaemonSet on node as a kubelet
// would report a crash-looping one (no kubelet here runs pods).
func createPlugdPod(t *testing.T, node string) {
	t.Helper()
	ctx := context.Background()
	p, err := admin.CoreV1().Pods("plugd").Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "plugd-" + node, Labels: map[string]string{"app.kubernetes.io/name": "plugd"}},
		Spec: corev1.PodSpec{NodeName: node, ServiceAccountName: "plugd", Containers: []corev1.Container{{Name: "plugd", Image: "ghcr.io/plugd/plugd:test",
			Ports: []corev1.ContainerPort{{Name: "status", ContainerPort: 9090}}}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Status = corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{{Name: "plugd", RestartCount: 5,
		State:                corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff", Message: "back-off 5m0s restarting failed container"}},
		LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, Reason: "Error"}}}}}
	if _, err := admin.CoreV1().Pods("plugd").UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}
