package kubenode

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/plugd/plugd/api"
)

// A plugin's taint as the status API shows it, through the loop: Present
// while the plugin waits for the kubelet, Removed once it is ready (the
// time from the kubelet's registration to the removal observed in
// plugd_taint_removal_seconds), Removed with the count and the writer of a
// re-add within the window, and Held, with its holder, once another writer
// puts it back after the window.
func TestTaintStatesInTheLoop(t *testing.T) {
	own := corev1.Taint{Key: "csi.example.com/agent-not-ready", Effect: corev1.TaintEffectNoExecute}
	reg := prometheus.NewPedanticRegistry()
	b := newBenchWith(t, func(c *Config) {
		c.Expect = []Expectation{{Type: TypeCSI, Name: "csi.example.com", Taint: own.Key + ":NoExecute"}}
		c.Registerer = reg
	}, &corev1.Node{ObjectMeta: metav1.ObjectMeta{ResourceVersion: "1"}, Spec: corev1.NodeSpec{Taints: []corev1.Taint{own}}})
	id := own.Key + ":NoExecute"
	view := func() api.TaintView {
		t.Helper()
		vs := b.n.TaintViews(TypeCSI, "csi.example.com")
		if len(vs) != 1 || vs[0].Taint != id {
			t.Fatalf("taint views: %+v; want one of %s", vs, id)
		}
		return vs[0]
	}
	onNode := func(want bool) {
		t.Helper()
		b.waitFor(fmt.Sprintf("the informer showing the taint on the Node: %v", want), func() bool {
			return slices.ContainsFunc(b.n.snapshot().node.Spec.Taints, func(tt corev1.Taint) bool { return tt.Key == own.Key }) == want
		})
	}
	readd := func() {
		t.Helper()
		n, err := b.cs.CoreV1().Nodes().Get(context.Background(), "node-a", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		n.Spec.Taints = append(n.Spec.Taints, own)
		if _, err := b.cs.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{FieldManager: "node-manager"}); err != nil {
			t.Fatal(err)
		}
		onNode(true)
	}

	started := b.clock.Now().Add(-time.Minute)
	b.setKubelet(started)
	b.step(time.Second)
	if v := view(); v.State != api.TaintPresent || !v.Since.IsZero() || v.Pending {
		t.Fatalf("before the plugin registers: %+v; want Present", v)
	}
	if got := b.n.TaintViews(TypeDevice, "gpu"); got != nil {
		t.Errorf("a plugin plugd does not expect has taint views: %+v", got)
	}

	csi := csiSocket(started, true)
	b.setPlugins(csi)
	b.setKubelet(started, csi.Path) // the first read that shows it registered
	registered := b.clock.Now()
	b.step(30 * time.Millisecond)
	if v := view(); v.State != api.TaintRemoved || !v.Since.Equal(registered.Add(30*time.Millisecond)) || v.ReRemovals != 0 {
		t.Fatalf("once ready: %+v; want Removed at %s", v, registered.Add(30*time.Millisecond))
	}
	onNode(false)
	histogram := func(count int) string {
		return fmt.Sprintf(`# HELP plugd_taint_removal_seconds Time from the first read of the kubelet that showed it held every plugin a startup taint waits for to plugd's removal of the taint (TaintRemoved), by taint (KEY:EFFECT). Observed only while plugd reads the kubelet's own state.
# TYPE plugd_taint_removal_seconds histogram
plugd_taint_removal_seconds_bucket{taint="%[1]s",le="0.01"} 0
plugd_taint_removal_seconds_bucket{taint="%[1]s",le="0.025"} 0
plugd_taint_removal_seconds_bucket{taint="%[1]s",le="0.05"} %[2]d
plugd_taint_removal_seconds_bucket{taint="%[1]s",le="0.1"} %[2]d
plugd_taint_removal_seconds_bucket{taint="%[1]s",le="0.25"} %[2]d
plugd_taint_removal_seconds_bucket{taint="%[1]s",le="0.5"} %[2]d
plugd_taint_removal_seconds_bucket{taint="%[1]s",le="1"} %[2]d
plugd_taint_removal_seconds_bucket{taint="%[1]s",le="2.5"} %[2]d
plugd_taint_removal_seconds_bucket{taint="%[1]s",le="5"} %[2]d
plugd_taint_removal_seconds_bucket{taint="%[1]s",le="10"} %[2]d
plugd_taint_removal_seconds_bucket{taint="%[1]s",le="30"} %[2]d
plugd_taint_removal_seconds_bucket{taint="%[1]s",le="60"} %[2]d
plugd_taint_removal_seconds_bucket{taint="%[1]s",le="120"} %[2]d
plugd_taint_removal_seconds_bucket{taint="%[1]s",le="300"} %[2]d
plugd_taint_removal_seconds_bucket{taint="%[1]s",le="600"} %[2]d
plugd_taint_removal_seconds_bucket{taint="%[1]s",le="+Inf"} %[2]d
plugd_taint_removal_seconds_sum{taint="%[1]s"} %[3]g
plugd_taint_removal_seconds_count{taint="%[1]s"} %[2]d
`, id, count, 0.03*float64(count))
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(histogram(1)), "plugd_taint_removal_seconds"); err != nil {
		t.Errorf("the registration to the removal: %v", err)
	}

	// Put back within the window: removed again; the count and the writer
	// shown, and no removal timed (the registration is long past).
	readd()
	b.step(5 * time.Second)
	v := view()
	if v.State != api.TaintRemoved || v.ReRemovals != 1 || v.ReaddedBy != "node-manager" || !v.Since.Equal(b.clock.Now()) {
		t.Fatalf("after a re-add within the window: %+v; want Removed now, 1 re-removal by node-manager", v)
	}
	onNode(false)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(histogram(1)), "plugd_taint_removal_seconds"); err != nil {
		t.Errorf("a re-removal timed as a removal: %v", err)
	}

	// Put back after the window: left to its writer, which holds it.
	b.step(10 * time.Minute)
	readd()
	b.step(time.Second)
	v = view()
	if v.State != api.TaintHeld || v.Holder != "node-manager" || v.Since.IsZero() || !strings.Contains(v.HeldBecause, "after the startup window") || v.ReRemovals != 1 {
		t.Fatalf("after a re-add past the window: %+v; want Held by node-manager", v)
	}
	held := b.n.HeldTaints()
	if len(held) != 1 || held[0].Taint != id || held[0].Holder != "node-manager" || held[0].Node != "node-a" || !slices.Equal(held[0].Plugins, []string{"CSIPlugin csi.example.com"}) {
		t.Errorf("held taints: %+v", held)
	}
}

// taintStates tells a taint's state from the Node as read, the writes
// made since, the changes decided and not made, and plugd's memory.
func TestTaintStates(t *testing.T) {
	at := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	r := taintRule{key: "k.example.com/x", effect: corev1.TaintEffectNoSchedule, conds: []string{"c"}}
	all := taintRule{key: "all.example.com/x", effect: corev1.TaintEffectNoSchedule, conds: []string{"c", "d"}, all: true}
	tainted := &corev1.Node{Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: r.key, Effect: r.effect}}}}
	clean := &corev1.Node{}
	for _, tc := range []struct {
		name    string
		node    *corev1.Node
		wrote   map[string]bool
		decided []taintChange
		mem     taintMemory
		want    api.TaintView
	}{
		{"on the Node, never touched", tainted, nil, nil, taintMemory{}, api.TaintView{State: api.TaintPresent}},
		{"on the Node, removal decided and not made", tainted, nil, []taintChange{{rule: r}}, taintMemory{},
			api.TaintView{State: api.TaintPresent, Pending: true}},
		{"removed in this act", tainted, map[string]bool{r.String(): false}, []taintChange{{rule: r}}, taintMemory{wrote: at},
			api.TaintView{State: api.TaintRemoved, Since: at}},
		{"removed before", clean, nil, nil, taintMemory{wrote: at, reRemovals: 2, readdedBy: "m"},
			api.TaintView{State: api.TaintRemoved, Since: at, ReRemovals: 2, ReaddedBy: "m"}},
		{"gone, not by plugd", clean, nil, nil, taintMemory{removed: at}, api.TaintView{State: api.TaintAbsent}},
		{"put back in this act", clean, map[string]bool{r.String(): true}, nil, taintMemory{restored: true, wrote: at},
			api.TaintView{State: api.TaintRestored, Since: at}},
		{"put back, then removed by someone", clean, nil, nil, taintMemory{restored: true, wrote: at}, api.TaintView{State: api.TaintAbsent}},
		{"held", tainted, nil, nil, taintMemory{wrote: at, left: &taintHolder{manager: "m", since: at.Add(time.Hour), why: "w"}},
			api.TaintView{State: api.TaintHeld, Since: at.Add(time.Hour), Holder: "m", HeldBecause: "w"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := taintStates([]taintRule{r, all}, tc.node, tc.wrote, tc.decided, map[string]taintMemory{r.String(): tc.mem})
			want := tc.want
			want.Taint = r.String()
			if len(got) != 2 || got[0].view != want || !slices.Equal(got[0].conds, r.conds) {
				t.Errorf("got %+v\nwant %+v", got[0], want)
			}
			if w := (api.TaintView{Taint: all.String(), All: true, State: api.TaintAbsent}); got[1].view != w {
				t.Errorf("the taint for all: %+v; want %+v", got[1].view, w)
			}
		})
	}
}

// A resource's taint (an expect entry with anyOf) is shown on each of its
// plugins, as a plain entry's is on its own.
func TestTaintViewsOfAResource(t *testing.T) {
	res := Expectation{Type: TypeAnyOf, Name: "gpu.example.com", Condition: "gpu.example.com/Ready", Taint: "example.com/gpu:NoSchedule",
		AnyOf: []Expectation{{Type: TypeDevice, Name: "vendor.example/gpu"}, {Type: TypeDRA, Name: "gpu.example.com"}}}
	n := &Node{cfg: Config{Expect: []Expectation{res}},
		taintStates: []taintState{{conds: []string{res.Condition}, view: api.TaintView{Taint: res.Taint, State: api.TaintRemoved}}}}
	for _, p := range res.AnyOf {
		if got := n.TaintViews(p.Type, p.Name); len(got) != 1 || got[0].Taint != res.Taint {
			t.Errorf("%s %s: taints %+v; want the resource's", p.Type, p.Name, got)
		}
	}
	if got := n.TaintViews(TypeCSI, "csi.example.com"); got != nil {
		t.Errorf("a plugin not expected: %+v", got)
	}
}
