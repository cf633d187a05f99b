//go:build linux

package kube

import (
	"context"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/plugd/plugd/internal/nodecond"
	"github.com/plugd/plugd/internal/testenv"
)

// The fleet summary against the real API server: plugd caretaker, with the
// shipped RBAC (a Role on the one ConfigMap), keeps the cluster view in
// plugd/plugd-fleet; kubectl plugd cluster answers from it, saying so and
// how old it is, and its answer is the paged list's (--source=nodes): the
// same counts of nodes, and of this test's plugin, node for node; a change of a condition is in the summary within seconds; the
// caretaker writes it at most every 10 seconds; without it the command
// reads the Nodes again.
func TestClusterSummary(t *testing.T) {
	const driver = "csi.summary.example.com"
	now := time.Now().Truncate(time.Second)
	for _, n := range []string{"summary-1", "summary-2", "summary-3"} {
		createNode(t, n)
		st := corev1.ConditionTrue
		if n == "summary-3" {
			st = corev1.ConditionFalse
		}
		setCondition(t, n, "plugd", plugdCondition(driver, st, now))
	}
	dir := testenv.ShortDir(t, "sum")
	admincfg := filepath.Join(dir, "admin.kubeconfig")
	if err := cp.WriteKubeconfig(admincfg, cp.AdminToken); err != nil {
		t.Fatal(err)
	}
	// Later tests' kubectl plugd cluster must not find it: gone after the
	// caretaker (cleanups run last first).
	t.Cleanup(func() {
		err := admin.CoreV1().ConfigMaps("plugd").Delete(context.Background(), nodecond.SummaryName, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Error(err)
		}
	})
	from := time.Now()
	startCaretaker(t, dir, "--summary-namespace", "plugd")

	view := func(source string) nodecond.ClusterView {
		t.Helper()
		out, code := kubectlPlugd(t, "cluster", "--kubeconfig", admincfg, "--source", source, "-o", "json")
		if code != 0 {
			t.Fatalf("kubectl plugd cluster --source %s: exit %d\n%s", source, code, out)
		}
		var v nodecond.ClusterView
		decode(t, out, &v)
		return v
	}
	counts := func(v nodecond.ClusterView) (int, int) {
		for _, p := range v.Plugins {
			if p.Name == driver {
				return p.Ready, p.Expected
			}
		}
		return 0, 0
	}
	var fromSummary nodecond.ClusterView
	eventually(t, "a summary counting the three nodes", func() (bool, string) {
		out, code := kubectlPlugd(t, "cluster", "--kubeconfig", admincfg, "--source", "summary", "-o", "json")
		if code != 0 {
			return false, out
		}
		decode(t, out, &fromSummary)
		r, e := counts(fromSummary)
		return r == 2 && e == 3, out
	})
	fromNodes := view("nodes")
	if fromSummary.Source != "summary" || fromNodes.Source != "nodes" || time.Since(fromSummary.AsOf) > 2*time.Minute {
		t.Errorf("sources %q (as of %s) and %q", fromSummary.Source, fromSummary.AsOf, fromNodes.Source)
	}
	// The whole cluster's counts, and this test's plugin node for node.
	// (Other tests' conditions, which nobody writes any more, may age out
	// between the summary's count and the list: they are not compared.)
	mine := func(v nodecond.ClusterView) []nodecond.ClusterPlugin {
		var out []nodecond.ClusterPlugin
		for _, p := range v.Plugins {
			if p.Name == driver {
				out = append(out, p)
			}
		}
		return out
	}
	if fromSummary.Nodes != fromNodes.Nodes || fromSummary.NodesWithPlugd != fromNodes.NodesWithPlugd || !reflect.DeepEqual(mine(fromSummary), mine(fromNodes)) {
		t.Errorf("the summary and the list of every Node disagree:\nsummary %d nodes, %d with plugd's, %+v\nnodes   %d nodes, %d with plugd's, %+v",
			fromSummary.Nodes, fromSummary.NodesWithPlugd, mine(fromSummary), fromNodes.Nodes, fromNodes.NodesWithPlugd, mine(fromNodes))
	}
	out, code := kubectlPlugd(t, "cluster", "--kubeconfig", admincfg)
	if code != 0 || !strings.Contains(out, "as plugd caretaker counted them") || !regexpMatch(`CSIPlugin\s+`+driver+`\s+2\s+3\s`, out) {
		t.Errorf("kubectl plugd cluster (%d):\n%s", code, out)
	}
	t.Logf("kubectl plugd cluster:\n%s", out)

	// A change is in the summary within the caretaker's 10 seconds.
	changed := time.Now()
	setCondition(t, "summary-3", "plugd", plugdCondition(driver, corev1.ConditionTrue, time.Now().Truncate(time.Second)))
	eventuallyWithin(t, 20*time.Second, "the summary counting the change", func() (bool, string) {
		v := view("summary")
		r, e := counts(v)
		return r == 3 && e == 3, ""
	})
	t.Logf("the change was in the summary after %s", time.Since(changed).Round(time.Millisecond))

	// At most one write per 10 seconds (and one at the start).
	writes, err := auditRequests(from, "/namespaces/plugd/configmaps/"+nodecond.SummaryName)
	if err != nil {
		t.Fatal(err)
	}
	patches := 0
	for _, w := range writes {
		if strings.HasPrefix(w, "patch ") {
			patches++
		}
	}
	if max := int(time.Since(from)/(10*time.Second)) + 2; patches == 0 || patches > max {
		t.Errorf("the caretaker wrote the summary %d times in %s; want 1 to %d", patches, time.Since(from).Round(time.Second), max)
	}

	// No summary (the caretaker wrote its last a moment ago, and writes
	// the next in a minute): the Nodes are read, silently.
	if err := admin.CoreV1().ConfigMaps("plugd").Delete(context.Background(), nodecond.SummaryName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if v := view("auto"); v.Source != "nodes" {
		t.Errorf("without a summary, kubectl plugd cluster counted from %q", v.Source)
	}
}
