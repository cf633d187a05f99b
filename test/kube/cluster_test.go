//go:build linux

package kube

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

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
	if !strings.Contains(out, driver+": not ready on 1 of 3 nodes") || !regexpMatch(`c-3\s+False\s+SocketMissing\s+\S+\s+plugd: CSIPlugin `+driver+`: no registration socket`, out) {
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
