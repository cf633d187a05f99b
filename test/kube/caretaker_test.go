//go:build linux

package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"

	"github.com/plugd/plugd/api"
	"github.com/plugd/plugd/internal/nodecond"
	"github.com/plugd/plugd/internal/testenv"
)

// caretakerProc is plugd caretaker running as a process.
type caretakerProc struct {
	cmd  *exec.Cmd
	out  *testenv.Buffer
	done chan struct{}
}

// startCaretaker runs plugd caretaker with the shipped RBAC's
// ServiceAccount, and args, until the test ends.
func startCaretaker(t *testing.T, dir string, args ...string) *caretakerProc {
	t.Helper()
	applyManifest(t, "deploy/kubernetes/daemonset.yaml")
	exp := int64(3600)
	tr, err := admin.CoreV1().ServiceAccounts("plugd").CreateToken(context.Background(), "plugd-caretaker",
		&authv1.TokenRequest{Spec: authv1.TokenRequestSpec{ExpirationSeconds: &exp}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(dir, "caretaker-kubeconfig")
	if err := cp.WriteKubeconfig(kubeconfig, tr.Status.Token); err != nil {
		t.Fatal(err)
	}
	c := &caretakerProc{out: &testenv.Buffer{}, done: make(chan struct{})}
	c.cmd = exec.Command(filepath.Join(dirs.Bin, "plugd"), append([]string{"caretaker", "--kubeconfig", kubeconfig}, args...)...)
	c.cmd.Stdout, c.cmd.Stderr = c.out, c.out
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // never outlive the test
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		c.cmd.Wait()
		close(c.done)
	}()
	t.Cleanup(func() {
		c.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-c.done:
			if code := c.cmd.ProcessState.ExitCode(); code != 0 {
				t.Errorf("the caretaker exited %d on SIGTERM", code)
			}
		case <-time.After(wait):
			c.cmd.Process.Kill()
			<-c.done
			t.Errorf("the caretaker did not stop on SIGTERM")
		}
		if t.Failed() {
			t.Logf("the caretaker's log:\n%s", c.out)
		}
	})
	eventually(t, "the caretaker watching Nodes", func() (bool, string) {
		select {
		case <-c.done:
			t.Fatalf("the caretaker exited: %s", c.out)
		default:
		}
		return strings.Contains(c.out.String(), "watching Nodes"), c.out.String()
	})
	return c
}

// createTrackedNode is createNode, with the API server recording who
// writes which field. A Node created with nothing but its name gets no
// managedFields entry, and then the API server records no later update
// of it either, until an apply (its field manager starts tracking an
// object only with a first entry); the kubelet creates its Node with
// labels, so clusters' Nodes have their record from the start. One
// label, applied, starts it here.
func createTrackedNode(t *testing.T, name string) {
	t.Helper()
	createNode(t, name)
	if _, err := admin.CoreV1().Nodes().Apply(context.Background(), corev1ac.Node(name).WithLabels(map[string]string{"example.com/tracked": "true"}),
		metav1.ApplyOptions{FieldManager: "test-setup"}); err != nil {
		t.Fatal(err)
	}
}

// setCondition writes c into node's status as field manager manager, as
// plugd writes its own (a strategic merge patch of nodes/status).
func setCondition(t *testing.T, node, manager string, c corev1.NodeCondition) {
	t.Helper()
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": []corev1.NodeCondition{c}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CoreV1().Nodes().Patch(context.Background(), node, types.StrategicMergePatchType, patch, metav1.PatchOptions{FieldManager: manager}, "status"); err != nil {
		t.Fatal(err)
	}
}

// plugdCondition is a condition in plugd's form about CSIPlugin name, last
// written at heartbeat.
func plugdCondition(name string, status corev1.ConditionStatus, heartbeat time.Time) corev1.NodeCondition {
	return corev1.NodeCondition{Type: corev1.NodeConditionType(name + "/CSIPluginReady"), Status: status, Reason: "PluginReady",
		Message:           nodecond.Message("CSIPlugin", name, "registered with the kubelet"),
		LastHeartbeatTime: metav1.NewTime(heartbeat), LastTransitionTime: metav1.NewTime(heartbeat.Add(-time.Hour))}
}

// ownsCondition says whether manager's managedFields entry of node's
// status holds the condition of type typ.
func ownsCondition(n *corev1.Node, manager, typ string) bool {
	key, _ := json.Marshal(map[string]string{"type": typ})
	for _, mf := range n.ManagedFields {
		if mf.Manager == manager && mf.Subresource == "status" && mf.FieldsV1 != nil {
			var f struct {
				Status struct {
					Conditions map[string]json.RawMessage `json:"f:conditions"`
				} `json:"f:status"`
			}
			if json.Unmarshal(mf.FieldsV1.Raw, &f) == nil && f.Status.Conditions["k:"+string(key)] != nil {
				return true
			}
		}
	}
	return false
}

// Issue 24: a condition of plugd's that nobody maintains does not go on
// saying True; issue 33, item 3: the caretaker judges by when it saw the
// heartbeat change, on its own clock, not by the heartbeat (the node's
// clock). The caretaker (the shipped RBAC, its bound shortened to 5s)
// marks Unknown/NotMaintained, as plugd's field manager, a condition
// whose heartbeat says 20 minutes in the future (a node clock ahead) and
// that nobody writes again, at the bound after the API server recorded
// its write; it leaves alone one whose heartbeat says 20 minutes ago (a
// node clock behind) that plugd keeps writing, and one in plugd's form
// written by another field manager.
func TestCaretaker(t *testing.T) {
	const (
		ahead  = "caretaker-ahead"  // (a)
		behind = "caretaker-behind" // (b)
		others = "caretaker-others" // (c)
		bound  = 5 * time.Second
	)
	for _, n := range []string{ahead, behind, others} {
		createTrackedNode(t, n)
	}
	typ := "csi.example.com/CSIPluginReady"
	now := time.Now().Truncate(time.Second)
	setCondition(t, others, "kubectl-edit", plugdCondition("csi.example.com", corev1.ConditionTrue, now.Add(-20*time.Minute)))
	setCondition(t, behind, "plugd", plugdCondition("csi.example.com", corev1.ConditionTrue, now.Add(-20*time.Minute)))
	setCondition(t, ahead, "plugd", plugdCondition("csi.example.com", corev1.ConditionTrue, now.Add(20*time.Minute)))
	before := map[string]*corev1.Node{}
	for _, n := range []string{ahead, behind, others} {
		before[n] = getNode(t, n)
	}
	written := nodecond.LastWrite(before[ahead], "plugd") // the API server's record of the write
	behindLog := watchConditions(t, behind, nil)
	// (b)'s plugd: a heartbeat of a clock 20 minutes behind, every second.
	ctx, cancel := context.WithCancel(context.Background())
	beating := make(chan error, 1)
	go func() {
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				beating <- nil
				return
			case at := <-tick.C:
				c := plugdCondition("csi.example.com", corev1.ConditionTrue, at.Truncate(time.Second).Add(-20*time.Minute))
				patch, _ := json.Marshal(map[string]any{"status": map[string]any{"conditions": []corev1.NodeCondition{c}}})
				if _, err := admin.CoreV1().Nodes().Patch(ctx, behind, types.StrategicMergePatchType, patch, metav1.PatchOptions{FieldManager: "plugd"}, "status"); err != nil && ctx.Err() == nil {
					beating <- err
					return
				}
			}
		}
	}()
	defer func() {
		cancel()
		if err := <-beating; err != nil {
			t.Errorf("(b)'s heartbeat: %v", err)
		}
	}()
	started := time.Now()
	startCaretaker(t, testenv.ShortDir(t, "kube"), "--stale-after", bound.String())

	t.Run("(a) a clock 20 minutes ahead, nobody writing: marked at the bound", func(t *testing.T) {
		c := waitCondition(t, ahead, typ, corev1.ConditionUnknown, nodecond.ReasonNotMaintained)
		was := condition(before[ahead], typ)
		n := getNode(t, ahead)
		if pt, name, ok := nodecond.Parse(c.Message); !ok || pt != "CSIPlugin" || name != "csi.example.com" ||
			!strings.Contains(c.Message, "(it said True, PluginReady; its last heartbeat, by the node's clock, "+was.LastHeartbeatTime.UTC().Format(time.RFC3339)+")") {
			t.Errorf("message %q", c.Message)
		}
		if !c.LastHeartbeatTime.Equal(&was.LastHeartbeatTime) {
			t.Errorf("heartbeat %v (was %v)", c.LastHeartbeatTime, was.LastHeartbeatTime)
		}
		// The bound is on the caretaker's clock, from the write the API
		// server recorded (whole seconds), not 20 minutes on.
		due := written.Add(bound)
		if c.LastTransitionTime.Before(&metav1.Time{Time: due}) || c.LastTransitionTime.After(due.Add(caretakerLatency)) {
			t.Errorf("marked at %v; want between %v and %v", c.LastTransitionTime, due, due.Add(caretakerLatency))
		}
		if !ownsCondition(n, "plugd", typ) {
			t.Errorf("plugd's field manager does not own the marked condition: %+v", n.ManagedFields)
		}
		for _, other := range []string{"Ready", "example.com/KernelDeadlock"} {
			if got, want := condition(n, other), condition(before[ahead], other); fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("%s changed: %+v, was %+v", other, got, want)
			}
		}
	})
	t.Run("(b) a clock 20 minutes behind, plugd writing: never marked", func(t *testing.T) {
		// Three bounds of the caretaker running, and every heartbeat
		// looked at.
		if d := 3*bound - time.Since(started); d > 0 {
			time.Sleep(d) // the time the caretaker is given to get it wrong, not a synchronisation
		}
		for _, tr := range behindLog.since(typ, started) {
			if tr.String() != "True/PluginReady" {
				t.Errorf("the condition went %v", behindLog.since(typ, started))
				break
			}
		}
	})
	t.Run("(c) another's: untouched", func(t *testing.T) {
		if got := getNode(t, others); got.ResourceVersion != before[others].ResourceVersion {
			t.Errorf("%s was written: %+v", others, condition(got, typ))
		}
	})
}

// Issue 24, end to end: plugd (observe mode) keeps its condition True;
// plugd is stopped (SIGKILL, and SIGTERM: a clean stop writes nothing
// either, docs/kubernetes.md "A condition nobody maintains") and the
// plugin goes meanwhile. Nobody maintains the condition any more: it
// stays True until the bound (the caretaker's, shortened to 5s), and no
// longer: the caretaker marks it Unknown/NotMaintained; plugd, started
// again, writes the truth (False), and owns the condition as before. A
// watch of the Node sees exactly that sequence.
func TestCaretakerPlugdGone(t *testing.T) {
	applyManifest(t, "deploy/kubernetes/daemonset.yaml")
	for _, c := range []struct {
		name string
		sig  syscall.Signal
	}{{"SIGKILL", syscall.SIGKILL}, {"SIGTERM", syscall.SIGTERM}} {
		t.Run(c.name, func(t *testing.T) {
			plugdGone(t, "caretaker-e2e-"+strings.ToLower(c.name), c.sig)
		})
	}
}

// caretakerLatency bounds, as a failure bound on a loaded machine, how
// long after the bound the caretaker may take to mark a condition: it
// looks at a Node again with a timer set for the first of its conditions
// to go stale, and writes at once (42-376 ms measured).
const caretakerLatency = 30 * time.Second

func plugdGone(t *testing.T, node string, sig syscall.Signal) {
	createTrackedNode(t, node)
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
	csiReg := startCSI(t, reg, filepath.Join(dir, "plugins"), csiName, node)
	config := fmt.Sprintf(`mode: observe
registryDir: %s
handlers: [{type: CSIPlugin, handler: csi}]
kubernetes: {kubeconfig: %s, nodeName: %s, kubelet: {address: none}}
expect:
  - {type: CSIPlugin, name: %s}
`, reg, kubeconfig, node, csiName)
	conds := watchConditions(t, node, nil)
	pd := startPlugd(t, dir, config)
	k.setCSIDriver(csiName, node)
	pd.waitKubelet(t, csiName, api.KubeletRegistered, "Inferred")
	waitCondition(t, node, csiCond, corev1.ConditionTrue, "Inferred")
	eventually(t, "the watch seeing the condition True", func() (bool, string) {
		seq := conds.since(csiCond, time.Time{})
		return len(seq) > 0 && seq[len(seq)-1].String() == "True/Inferred", fmt.Sprint(seq)
	})

	// plugd stopped; the plugin goes, and the kubelet deregisters it.
	stopped := time.Now()
	pd.cmd.Process.Signal(sig)
	<-pd.done
	if sig == syscall.SIGTERM && pd.cmd.ProcessState.ExitCode() != 0 {
		t.Errorf("plugd exited %d on SIGTERM:\n%s", pd.cmd.ProcessState.ExitCode(), pd.out)
	}
	csiReg.Close()
	k.setCSIDriver(csiName, "")
	last := condition(getNode(t, node), csiCond)
	if last.Status != corev1.ConditionTrue {
		t.Fatalf("before the caretaker: %+v", last)
	}

	const bound = 5 * time.Second
	startCaretaker(t, dir, "--stale-after", bound.String())
	c := waitCondition(t, node, csiCond, corev1.ConditionUnknown, nodecond.ReasonNotMaintained)
	due := last.LastHeartbeatTime.Add(bound)
	t.Logf("%s: last heartbeat %s, stale at %s, seen Unknown %s after", sig, last.LastHeartbeatTime.Format(time.RFC3339), due.Format(time.RFC3339),
		time.Since(due).Round(time.Millisecond))
	if c.LastTransitionTime.Before(&metav1.Time{Time: due}) || !c.LastHeartbeatTime.Equal(&last.LastHeartbeatTime) {
		t.Errorf("marked: %+v; last written %+v", c, last)
	}
	// Not True past the bound: the caretaker's write is stamped when it
	// was made (whole seconds).
	if limit := due.Add(caretakerLatency); c.LastTransitionTime.After(limit) {
		t.Errorf("True until %s, past the bound (%s) and the caretaker's latency", c.LastTransitionTime.Format(time.RFC3339), due.Format(time.RFC3339))
	}

	// plugd again: the truth, False, written over the caretaker's mark.
	pd = startPlugd(t, dir, config)
	c = waitCondition(t, node, csiCond, corev1.ConditionFalse, "SocketMissing")
	if !ownsCondition(getNode(t, node), "plugd", csiCond) {
		t.Errorf("plugd does not own its condition again")
	}
	t.Logf("plugd started again: %s %s: %s", c.Status, c.Reason, c.Message)
	// From plugd's stop: nothing written by the stop itself (no False,
	// no Unknown of plugd's), the caretaker's mark, plugd's truth.
	var seq []string
	for _, tr := range conds.since(csiCond, stopped) {
		seq = append(seq, tr.String())
	}
	if want := []string{"Unknown/" + nodecond.ReasonNotMaintained, "False/SocketMissing"}; !slices.Equal(seq, want) {
		t.Errorf("after plugd's %s the condition went %v; want %v", sig, seq, want)
	}
}
