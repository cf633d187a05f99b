//go:build linux

package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/yaml"

	"github.com/plugd/plugd/internal/nodecond"
	"github.com/plugd/plugd/internal/testenv"
)

// Three nodes, each with its plugd (two observing, one managing), expecting
// one CSI driver that two of them have: plugctl cluster, reading only the
// API server, says 2 of 3 and which node lacks it, and why.
func TestCluster(t *testing.T) {
	applyManifest(t, "deploy/kubernetes/daemonset.yaml")
	token := plugdToken(t)
	const driver = "csi.cluster.example.com"
	cond := driver + "/CSIPluginReady"
	base := testenv.ShortDir(t, "clu")
	admincfg := filepath.Join(base, "admin.kubeconfig")
	if err := cp.WriteKubeconfig(admincfg, cp.AdminToken); err != nil {
		t.Fatal(err)
	}
	for i, n := range []struct {
		name, mode string
		plugin     bool
	}{{"c-1", "observe", true}, {"c-2", "manage", true}, {"c-3", "observe", false}} {
		createNode(t, n.name)
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
		startPlugd(t, dir, fmt.Sprintf("mode: %s\nregistryDir: %s\nhandlers: [{type: CSIPlugin, handler: csi}]\nliveness: {probeInterval: 300ms}\n"+
			"kubernetes: {kubeconfig: %s, nodeName: %s, kubelet: {address: none}}\nexpect: [{type: CSIPlugin, name: %s}]\n", n.mode, reg, kubeconfig, n.name, driver))
	}
	waitCondition(t, "c-1", cond, corev1.ConditionTrue, "Inferred")
	waitCondition(t, "c-2", cond, corev1.ConditionTrue, "Inferred")
	waitCondition(t, "c-3", cond, corev1.ConditionFalse, "SocketMissing")

	out, code := plugctl(t, "cluster", "--kubeconfig", admincfg)
	if code != 0 || !regexpMatch(`CSIPlugin\s+`+driver+`\s+2\s+3\s+`+cond, out) {
		t.Errorf("plugctl cluster (%d):\n%s", code, out)
	}
	t.Logf("plugctl cluster:\n%s", out)
	out, _ = plugctl(t, "cluster", "--kubeconfig", admincfg, "-o", "wide")
	if !strings.Contains(out, driver+": not ready on 1 of 3 nodes") || !regexpMatch(`c-3\s+False\s+SocketMissing\s+\S+\s+-\s+plugd: CSIPlugin `+driver+`: no registration socket`, out) {
		t.Errorf("plugctl cluster -o wide:\n%s", out)
	}
	t.Logf("plugctl cluster -o wide:\n%s", out)
	out, _ = plugctl(t, "cluster", "--kubeconfig", admincfg, "-o", "json")
	var v nodecond.ClusterView
	decode(t, out, &v)
	found := false
	for _, p := range v.Plugins {
		if p.Name == driver {
			found = p.Ready == 2 && p.Expected == 3 && len(p.NotReady) == 1 && p.NotReady[0].Node == "c-3"
		}
	}
	if !found || v.Nodes < 3 {
		t.Errorf("plugctl cluster -o json: %+v", v)
	}
	if _, code := plugctl(t, "cluster", "--kubeconfig", admincfg, "--context", "nope"); code != 1 {
		t.Errorf("an unknown context: exit %d", code)
	}
}

// Issue 25, item 11, against the real API server, which checks nothing in
// a condition's type, reason or message: on one node a condition in
// plugd's form that another field manager wrote, on another one written
// under plugd's field manager whose reason holds DEL, C1 controls, bidi
// and zero-width characters and whose message is a megabyte of them.
// plugctl cluster and kubectl plugd cluster count only the second (the
// managedFields say plugd set it), -o wide prints its message cut,
// -o json escapes what a terminal acts on and still gives it back, and
// -o yaml prints the view instead of failing.
func TestClusterHostileConditions(t *testing.T) {
	const label = "plugd.test/suite=hostile"
	admincfg := filepath.Join(testenv.ShortDir(t, "hos"), "admin.kubeconfig")
	if err := cp.WriteKubeconfig(admincfg, cp.AdminToken); err != nil {
		t.Fatal(err)
	}
	hostile := "a\x7fb\u009b31mc\u202ed\u2066e\u200bf\ufeffg"
	huge := nodecond.Prefix + "CSIPlugin hostile.example.com: " + strings.Repeat("\u009b\u202eé\x7f", 1<<17) // 832 KiB
	for node, w := range map[string]struct{ manager, message string }{
		"h-forged": {"intruder", nodecond.Message("CSIPlugin", "forged.example.com", "looks like plugd's")},
		"h-plugd":  {nodecond.FieldManager, huge},
	} {
		createNode(t, node)
		labelNode(t, node, label)
		now := metav1.Now()
		patch, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": []corev1.NodeCondition{{Type: "hostile.example.com/CSIPluginReady",
			Status: corev1.ConditionFalse, Reason: hostile, Message: w.message, LastHeartbeatTime: now, LastTransitionTime: now}}}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := admin.CoreV1().Nodes().Patch(context.Background(), node, types.StrategicMergePatchType, patch,
			metav1.PatchOptions{FieldManager: w.manager}, "status"); err != nil {
			t.Fatal(err)
		}
	}
	unsafe := func(r rune) bool { return r >= 0x7f && !unicode.IsPrint(r) }
	for _, cli := range []func(*testing.T, ...string) (string, int){plugctl, kubectlPlugd} {
		out, code := cli(t, "cluster", "--kubeconfig", admincfg, "-l", label, "-o", "json")
		if i := strings.IndexFunc(out, unsafe); code != 0 || i >= 0 {
			t.Fatalf("cluster -o json (exit %d) lets %q through raw", code, out[i:min(i+4, len(out))])
		}
		var v nodecond.ClusterView
		decode(t, out, &v)
		if v.Nodes != 2 || v.NodesWithPlugd != 1 || len(v.Plugins) != 1 || v.Plugins[0].Name != "hostile.example.com" ||
			len(v.Plugins[0].NotReady) != 1 || v.Plugins[0].NotReady[0].Reason != hostile || v.Plugins[0].NotReady[0].Message != huge {
			t.Fatalf("cluster -o json counts another manager's condition, or does not give the text back: %d nodes, %d with plugd, %d plugins",
				v.Nodes, v.NodesWithPlugd, len(v.Plugins))
		}
		out, code = cli(t, "cluster", "--kubeconfig", admincfg, "-l", label, "-o", "yaml")
		var y nodecond.ClusterView
		if err := yaml.UnmarshalStrict([]byte(out), &y); code != 0 || err != nil || strings.IndexFunc(out, unsafe) >= 0 {
			t.Errorf("cluster -o yaml (exit %d, %v): %.300s", code, err, out)
		} else if y.Plugins[0].NotReady[0].Reason != hostile || y.Plugins[0].NotReady[0].Message != huge {
			t.Errorf("cluster -o yaml does not give the text back: %q", y.Plugins[0].NotReady[0].Reason)
		}
		out, code = cli(t, "cluster", "--kubeconfig", admincfg, "-l", label, "-o", "wide")
		if code != 0 || len(out) > 2048 || !strings.Contains(out, "...") || strings.IndexFunc(out, unsafe) >= 0 || strings.Contains(out, "forged") {
			t.Errorf("cluster -o wide (exit %d, %d bytes):\n%.2000s", code, len(out), out)
		}
		t.Logf("cluster -o wide:\n%s", out)
	}
}
