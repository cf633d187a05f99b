//go:build linux

package kube

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/plugd/plugd/internal/nodecond"
	"github.com/plugd/plugd/internal/testenv"
)

// Issue 32, item 5: the bound the shipped caretaker keeps on a dead
// plugd's True, and what the test asserts of it.
const (
	caretakerUser = "system:serviceaccount:plugd:plugd-caretaker"
	deadBound     = time.Minute
)

// shippedCaretaker is the caretaker's arguments in deploy/kubernetes (but
// the first, "caretaker") and the labels of plugd's DaemonSet pods there.
func shippedCaretaker(t *testing.T) (args []string, podLabels map[string]string) {
	t.Helper()
	for _, obj := range manifestObjects(t, "deploy/kubernetes/daemonset.yaml") {
		switch o := obj.(type) {
		case *appsv1.Deployment:
			if o.Name == "plugd-caretaker" {
				args = o.Spec.Template.Spec.Containers[0].Args[1:]
			}
		case *appsv1.DaemonSet:
			podLabels = o.Spec.Template.Labels
		}
	}
	if args == nil || podLabels == nil {
		t.Fatal("deploy/kubernetes/daemonset.yaml has no caretaker Deployment or no DaemonSet")
	}
	return args, podLabels
}

// plugdPod creates the pod name of plugd's DaemonSet on node, with the
// DaemonSet's labels, as the DaemonSet controller would (none runs here),
// and reports it as the kubelet would: Ready or not.
func plugdPod(t *testing.T, name, node string, labels map[string]string, ready bool) {
	t.Helper()
	p, err := admin.CoreV1().Pods("plugd").Create(context.Background(), &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec: corev1.PodSpec{NodeName: node, ServiceAccountName: "plugd",
			Containers: []corev1.Container{{Name: "plugd", Image: "ghcr.io/plugd/plugd:test"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		zero := int64(0)
		admin.CoreV1().Pods("plugd").Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	})
	setPodReady(t, p, ready)
}

// setPodReady reports plugd's pod p Ready or not, as the kubelet does:
// not Ready, its container is crash-looping.
func setPodReady(t *testing.T, p *corev1.Pod, ready bool) {
	t.Helper()
	ctx := context.Background()
	p, err := admin.CoreV1().Pods("plugd").Get(ctx, p.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	now := metav1.Now()
	p.Status = corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{
		{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now}}}
	if !ready {
		p.Status.Conditions[0].Status = corev1.ConditionFalse
		p.Status.Conditions[0].Reason = "ContainersNotReady"
		p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "plugd", RestartCount: 1,
			State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}}}}
	}
	if _, err := admin.CoreV1().Pods("plugd").UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// unknownAfter is how long after from the condition log saw cond turn
// Unknown with reason; fails the test if it did not.
func unknownAfter(t *testing.T, conds *conditionLog, cond, reason string, from time.Time) time.Duration {
	t.Helper()
	var at time.Time
	eventually(t, "the watch seeing "+cond+" Unknown/"+reason, func() (bool, string) {
		seq := conds.since(cond, from)
		i := slices.IndexFunc(seq, func(tr transition) bool { return tr.String() == "Unknown/"+reason })
		if i < 0 {
			return false, fmt.Sprint(seq)
		}
		at = seq[i].at
		return true, ""
	})
	return at.Sub(from)
}

// Issue 32, item 5, beside a real kubelet, with the shipped caretaker's
// flags: plugd SIGKILLed, then the CSI driver's registrar stopped; the
// kubelet deregisters it and drops it from CSINode, nobody writes the
// condition, and the caretaker marks it Unknown/PlugdNotRunning well
// within a minute of the kill (not 11 minutes). A steady minute before,
// with plugd running: the caretaker writes nothing and reads, per node,
// what the audit log counts.
func TestCaretakerDeadPlugd(t *testing.T) {
	const node = "k-dead-plugd"
	k := startKubelet(t, node)
	applyManifest(t, "deploy/kubernetes/daemonset.yaml")
	dir := testenv.ShortDir(t, "kd")
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := cp.WriteKubeconfig(kubeconfig, plugdToken(t)); err != nil {
		t.Fatal(err)
	}
	config := fmt.Sprintf(`mode: observe
registryDir: %s
handlers: [{type: CSIPlugin, handler: csi}]
kubernetes:
  kubeconfig: %s
  nodeName: %s
  kubelet: {address: %q, caFile: %s, podResourcesSocket: %s}
expect:
  - {type: CSIPlugin, name: %s}
`, k.RegistryDir, kubeconfig, node, k.Addr, k.CertFile, k.PodResources, csiName)
	conds := watchConditions(t, node, nil)
	csi := newCSIPeer(t, dir, k.RegistryDir)
	csi.startDriver(t, node)
	csi.startRegistrar(t)
	pd := startPlugd(t, dir, config)
	waitCondition(t, node, csiCond, corev1.ConditionTrue, "PluginReady")
	args, _ := shippedCaretaker(t)
	ctStarted := time.Now()
	ct := startCaretaker(t, dir, args...)

	t.Run("a steady minute: no write, the caretaker's reads", func(t *testing.T) {
		from := time.Now()
		time.Sleep(time.Minute) // the window measured, not a synchronisation
		to := time.Now()
		by, err := auditCount(caretakerUser, from, to)
		if err != nil {
			t.Fatal(err)
		}
		nodes, err := admin.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		start, err := auditCount(caretakerUser, ctStarted, from)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("the caretaker's requests: from its start to its first look %v; over %s of steady state, %d Node(s): %v",
			start, to.Sub(from).Round(time.Second), len(nodes.Items), by)
		// No write of a Node at steady state; the one write it makes is
		// its fleet summary, one ConfigMap for the whole cluster, at most
		// once a minute (and once more within 10 s of a change).
		onNodes, err := auditCountOf(caretakerUser, "nodes", from, to)
		if err != nil {
			t.Fatal(err)
		}
		summary, err := auditCountOf(caretakerUser, "configmaps", from, to)
		if err != nil {
			t.Fatal(err)
		}
		if onNodes["patch"] != 0 || onNodes["update"] != 0 || onNodes["create"] != 0 || onNodes["delete"] != 0 {
			t.Errorf("the caretaker wrote Nodes at steady state: %v", onNodes)
		}
		if summary["patch"]+summary["create"] > 2 || by["patch"]+by["create"] != summary["patch"]+summary["create"] || by["update"]+by["delete"] != 0 {
			t.Errorf("the caretaker's writes at steady state: %v, of its fleet summary %v; want only the summary's, at most 2 in a minute", by, summary)
		}
		if seq := conds.since(csiCond, from); len(seq) != 0 {
			t.Errorf("the condition was written with plugd running: %v", seq)
		}
	})

	t.Run("plugd SIGKILLed, then the registrar stopped: not True within a minute", func(t *testing.T) {
		killed := time.Now()
		pd.cmd.Process.Signal(syscall.SIGKILL)
		<-pd.done
		csi.registrar.signal(syscall.SIGTERM)
		var dropped time.Duration
		eventually(t, "the kubelet dropping the driver from CSINode", func() (bool, string) {
			c, err := admin.StorageV1().CSINodes().Get(context.Background(), node, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			dropped = time.Since(killed)
			return !slices.ContainsFunc(c.Spec.Drivers, func(d storagev1.CSINodeDriver) bool { return d.Name == csiName }), fmt.Sprint(c.Spec.Drivers)
		})
		d := unknownAfter(t, conds, csiCond, nodecond.ReasonPlugdNotRunning, killed)
		t.Logf("SIGKILL to the driver gone from CSINode: %s; to the condition Unknown/PlugdNotRunning: %s", dropped.Round(time.Millisecond), d.Round(time.Millisecond))
		if d > deadBound {
			t.Errorf("True for %s after plugd's SIGKILL, more than %s", d.Round(time.Millisecond), deadBound)
		}
		c := condition(getNode(t, node), csiCond)
		if !strings.Contains(c.Message, "dropped the driver from this node's CSINode") || !ownsCondition(getNode(t, node), "plugd", csiCond) {
			t.Errorf("marked: %+v", c)
		}
		// plugd again: the truth over the mark.
		pd = startPlugd(t, dir, config)
		waitCondition(t, node, csiCond, corev1.ConditionFalse, "SocketMissing")
		var seq []string
		for _, tr := range conds.since(csiCond, killed) {
			seq = append(seq, tr.String())
		}
		if want := []string{"Unknown/" + nodecond.ReasonPlugdNotRunning, "False/SocketMissing"}; !slices.Equal(seq, want) {
			t.Errorf("after plugd's SIGKILL the condition went %v; want %v", seq, want)
		}
		if n := strings.Count(ct.out.String(), "marked Unknown"); n != 1 {
			t.Errorf("the caretaker marked %d conditions, want 1:\n%s", n, ct.out)
		}
	})
}

// Issue 32, item 5, on a Node without a kubelet, plugd's DaemonSet pods
// played by the test as the DaemonSet controller and the kubelet would
// write them, the shipped caretaker's flags: a rolling update (the old pod
// deleted and plugd stopped, a new pod Ready 20 s later with a new plugd)
// writes nothing, even past the grace; plugd SIGKILLed and its pod
// reported not Ready (crash-looping) has its conditions Unknown,
// PlugdNotRunning, within a minute; plugd back, Ready, writes the truth.
func TestCaretakerPlugdPod(t *testing.T) {
	const node = "caretaker-pod"
	createTrackedNode(t, node)
	applyManifest(t, "deploy/kubernetes/daemonset.yaml")
	k := apiKubelet{t, node}
	dir := testenv.ShortDir(t, "kube")
	reg := filepath.Join(dir, "plugins_registry")
	for _, d := range []string{reg, filepath.Join(dir, "plugins")} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := cp.WriteKubeconfig(kubeconfig, plugdToken(t)); err != nil {
		t.Fatal(err)
	}
	startCSI(t, reg, filepath.Join(dir, "plugins"), csiName, node)
	config := fmt.Sprintf(`mode: observe
registryDir: %s
handlers: [{type: CSIPlugin, handler: csi}]
kubernetes: {kubeconfig: %s, nodeName: %s, kubelet: {address: none}}
expect:
  - {type: CSIPlugin, name: %s}
`, reg, kubeconfig, node, csiName)
	args, labels := shippedCaretaker(t)
	grace := 40 * time.Second
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--pod-grace="); ok {
			var err error
			if grace, err = time.ParseDuration(v); err != nil {
				t.Fatal(err)
			}
		}
	}
	conds := watchConditions(t, node, nil)
	plugdPod(t, "plugd-1", node, labels, true)
	pd := startPlugd(t, dir, config)
	k.setCSIDriver(csiName, node)
	waitCondition(t, node, csiCond, corev1.ConditionTrue, "Inferred")
	ct := startCaretaker(t, dir, args...)
	top := t

	t.Run("a rolling update: the old pod deleted, a new one Ready 20s later: no write", func(t *testing.T) {
		from := time.Now()
		ctx := context.Background()
		// The DaemonSet controller deletes the old pod; the kubelet stops
		// plugd (SIGTERM) and then removes the pod.
		if err := admin.CoreV1().Pods("plugd").Delete(ctx, "plugd-1", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		pd.stop(t)
		zero := int64(0)
		if err := admin.CoreV1().Pods("plugd").Delete(ctx, "plugd-1", metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
			t.Fatal(err)
		}
		// The new pod, created, scheduled, its image pulled, plugd
		// started, its readiness probe passed: 20 s on.
		plugdPod(top, "plugd-2", node, labels, false)
		pd = startPlugd(top, dir, config)
		time.Sleep(time.Until(from.Add(20 * time.Second))) // the gap of a rolling update, not a synchronisation
		setPodReady(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "plugd-2"}}, true)
		time.Sleep(time.Until(from.Add(grace + 10*time.Second))) // the time the caretaker is given to get it wrong
		if seq := conds.since(csiCond, from); len(seq) != 0 {
			t.Errorf("the condition was written over a rolling update: %v", seq)
		}
		if strings.Contains(ct.out.String(), "marked Unknown") {
			t.Errorf("the caretaker marked a condition:\n%s", ct.out)
		}
	})

	t.Run("plugd SIGKILLed, its pod not Ready: not True within a minute", func(t *testing.T) {
		killed := time.Now()
		pd.cmd.Process.Signal(syscall.SIGKILL)
		<-pd.done
		// The kubelet reports the dead container (a second or two in a
		// cluster), and plugd crash-loops.
		setPodReady(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "plugd-2"}}, false)
		d := unknownAfter(t, conds, csiCond, nodecond.ReasonPlugdNotRunning, killed)
		t.Logf("SIGKILL to the condition Unknown/PlugdNotRunning: %s (grace %s)", d.Round(time.Millisecond), grace)
		if d > deadBound || d < grace {
			t.Errorf("True for %s after plugd's SIGKILL; want between the grace (%s) and %s", d.Round(time.Millisecond), grace, deadBound)
		}
		if c := condition(getNode(t, node), csiCond); !strings.Contains(c.Message, "plugd's pod on this node has not been Ready since") {
			t.Errorf("marked: %+v", c)
		}
		// plugd back, its pod Ready: the truth over the mark.
		pd = startPlugd(top, dir, config)
		setPodReady(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "plugd-2"}}, true)
		waitCondition(t, node, csiCond, corev1.ConditionTrue, "Inferred")
		var seq []string
		for _, tr := range conds.since(csiCond, killed) {
			seq = append(seq, tr.String())
		}
		if want := []string{"Unknown/" + nodecond.ReasonPlugdNotRunning, "True/Inferred"}; !slices.Equal(seq, want) {
			t.Errorf("after plugd's SIGKILL the condition went %v; want %v", seq, want)
		}
	})
}
