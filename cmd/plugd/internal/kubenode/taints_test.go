package kubenode

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/plugd/plugd/internal/nodecond"
)

func TestTaintRules(t *testing.T) {
	ebs := Expectation{Type: "CSIPlugin", Name: "ebs.csi.aws.com", Condition: "ebs/Ready", Taint: "ebs.csi.aws.com/agent-not-ready:NoExecute"}
	efs := Expectation{Type: "CSIPlugin", Name: "efs.csi.aws.com", Condition: "efs/Ready", Taint: "efs.csi.aws.com/agent-not-ready:NoExecute"}
	gpu := Expectation{Type: "DevicePlugin", Name: "example.com/gpu", Condition: "gpu/Ready"}
	shared := func(e Expectation, taint string, retaint bool) Expectation {
		e.Taint, e.Retaint = taint, retaint
		return e
	}

	rules, err := taintRules([]Expectation{ebs, efs, gpu, shared(gpu, "", false)}, "example.com/plugins:NoSchedule")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range rules {
		got = append(got, r.String()+" "+strings.Join(r.conds, ","))
	}
	want := []string{"ebs.csi.aws.com/agent-not-ready:NoExecute ebs/Ready", "efs.csi.aws.com/agent-not-ready:NoExecute efs/Ready",
		"example.com/plugins:NoSchedule ebs/Ready,efs/Ready,gpu/Ready,gpu/Ready"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("rules:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	// Several plugins on one key: one rule, removed when all are ready.
	one := "example.com/storage-not-ready:NoSchedule"
	rules, err = taintRules([]Expectation{shared(ebs, one, false), shared(efs, one, false)}, "")
	if err != nil || len(rules) != 1 || len(rules[0].conds) != 2 {
		t.Errorf("a shared key = %+v, %v; want one rule of both conditions", rules, err)
	}

	for name, tc := range map[string]struct {
		expect []Expectation
		global string
		want   string
	}{
		"one key, two effects":  {[]Expectation{shared(ebs, "k.example.com/x:NoSchedule", false), shared(efs, "k.example.com/x:NoExecute", false)}, "", "one key, one effect"},
		"retaint on some":       {[]Expectation{shared(ebs, one, true), shared(efs, one, false)}, "", "disagree about retaint"},
		"retaint without taint": {[]Expectation{shared(gpu, "", true)}, "", "retaint is set, but taint is not"},
		"global named twice":    {[]Expectation{ebs}, "ebs.csi.aws.com/agent-not-ready:NoSchedule", "name it once"},
		"a key Kubernetes owns": {[]Expectation{shared(ebs, "node.kubernetes.io/not-ready:NoExecute", false)}, "", "Kubernetes reserves"},
		"not KEY:EFFECT":        {[]Expectation{shared(ebs, "ebs-not-ready", false)}, "", "KEY:EFFECT"},
	} {
		if _, err := taintRules(tc.expect, tc.global); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v; want it to say %q", name, err, tc.want)
		}
	}
}

// TestDecideTaints walks the lives of a taint: the startup removal, a
// re-add within the window and after it, the bound, retaint, a restart of
// plugd and a condition gone Unknown.
func TestDecideTaints(t *testing.T) {
	boot := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	rule := taintRule{key: "ebs.csi.aws.com/agent-not-ready", effect: corev1.TaintEffectNoExecute, conds: []string{"ebs/Ready"}}
	retaint := rule
	retaint.retaint = true
	tainted := []corev1.Taint{{Key: rule.key, Effect: rule.effect}, {Key: "other", Effect: corev1.TaintEffectNoSchedule}}
	other := []corev1.Taint{{Key: "other", Effect: corev1.TaintEffectNoSchedule}}
	at := func(d time.Duration) time.Time { return boot.Add(d) }
	ready := func(since time.Duration) map[string]condNow {
		return map[string]condNow{"ebs/Ready": {corev1.ConditionTrue, at(since)}}
	}
	notReady := map[string]condNow{"ebs/Ready": {corev1.ConditionFalse, at(0)}}
	unknown := map[string]condNow{"ebs/Ready": {corev1.ConditionUnknown, at(0)}}
	kubelet := taintHolder{manager: "kubelet", since: at(0)}
	plugd := taintHolder{manager: nodecond.FieldManager, since: at(20 * time.Second)}
	nodeManager := func(d time.Duration) taintHolder { return taintHolder{manager: "node-manager", since: at(d)} }
	removed := func(d time.Duration) taintMemory { return taintMemory{ready: true, removed: at(d), boot: boot} }

	type step struct {
		name   string
		now    time.Duration
		taints []corev1.Taint
		owner  taintHolder
		conds  map[string]condNow
		want   string // "" (no write), or the change: "remove TaintRemoved", "add TaintRestored", ...
	}
	for _, tc := range []struct {
		name  string
		rule  taintRule
		mem   taintMemory
		steps []step
	}{
		{"startup: left while not ready, removed once ready", rule, taintMemory{}, []step{
			{"not ready", 5 * time.Second, tainted, kubelet, notReady, ""},
			{"unknown", 6 * time.Second, tainted, kubelet, unknown, ""},
			{"ready", 10 * time.Second, tainted, kubelet, ready(10 * time.Second), "remove TaintRemoved"},
			{"gone", 11 * time.Second, other, plugd, ready(10 * time.Second), ""},
		}},
		{"re-added within the window: removed again, naming the writer", rule, removed(10 * time.Second), []step{
			{"re-added", 15 * time.Second, tainted, nodeManager(15 * time.Second), ready(10 * time.Second), "remove TaintReadded node-manager"},
			{"gone again", 16 * time.Second, other, plugd, ready(10 * time.Second), ""},
		}},
		{"re-added after the window: left to its writer", rule, removed(10 * time.Second), []step{
			{"re-added", 11 * time.Minute, tainted, nodeManager(11 * time.Minute), ready(10 * time.Second), ""},
			{"still there", 12 * time.Minute, tainted, nodeManager(11 * time.Minute), ready(10 * time.Second), ""},
		}},
		{"a writer that keeps putting it back: bounded", rule, removed(10 * time.Second), []step{
			{"1", 20 * time.Second, tainted, nodeManager(20 * time.Second), ready(10 * time.Second), "remove TaintReadded node-manager"},
			{"2", 30 * time.Second, tainted, nodeManager(30 * time.Second), ready(10 * time.Second), "remove TaintReadded node-manager"},
			{"3", 40 * time.Second, tainted, nodeManager(40 * time.Second), ready(10 * time.Second), "remove TaintReadded node-manager"},
			{"4: left", 50 * time.Second, tainted, nodeManager(50 * time.Second), ready(10 * time.Second), ""},
			{"gone: the holder let go", time.Minute, other, nodeManager(time.Minute), ready(10 * time.Second), ""},
		}},
		{"a new plugd: the Node's record tells a re-add from the startup taint", rule, taintMemory{}, []step{
			{"not judged yet", 2 * time.Minute, tainted, nodeManager(time.Minute), map[string]condNow{}, ""},
			{"written after ready: a re-add", 2 * time.Minute, tainted, nodeManager(time.Minute), ready(30 * time.Second), "remove TaintReadded node-manager"},
		}},
		{"a new plugd: written before ready, the startup taint", rule, taintMemory{}, []step{
			{"ready", 2 * time.Minute, tainted, nodeManager(20 * time.Second), ready(30 * time.Second), "remove TaintRemoved"},
		}},
		{"a new plugd: written after ready, past the window", rule, taintMemory{}, []step{
			{"left", 20 * time.Minute, tainted, nodeManager(15 * time.Minute), ready(30 * time.Second), ""},
		}},
		{"retaint: put back on False, removed on True, once each", retaint, taintMemory{}, []step{
			{"ready", 10 * time.Second, tainted, kubelet, ready(10 * time.Second), "remove TaintRemoved"},
			{"not ready", 20 * time.Second, other, plugd, notReady, "add TaintRestored"},
			{"not ready, put back", 21 * time.Second, tainted, plugd, notReady, ""},
			{"unknown: kept", 22 * time.Second, tainted, plugd, unknown, ""},
			{"ready again", 30 * time.Second, tainted, plugd, ready(30 * time.Second), "remove TaintRemoved"},
		}},
		{"retaint: someone removed the taint plugd put back: not fought", retaint, taintMemory{ready: true, removed: at(5 * time.Second), boot: boot}, []step{
			{"not ready", 20 * time.Second, other, plugd, notReady, "add TaintRestored"},
			{"removed by someone", 25 * time.Second, other, nodeManager(25 * time.Second), notReady, ""},
		}},
		{"retaint: not before plugd saw it ready (a restart of plugd)", retaint, taintMemory{}, []step{
			{"not ready", 5 * time.Second, other, plugd, notReady, ""},
			{"unknown", 6 * time.Second, other, plugd, unknown, ""},
		}},
		{"retaint: Unknown puts nothing back", retaint, removed(5 * time.Second), []step{
			{"unknown", 20 * time.Second, other, plugd, unknown, ""},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mem := map[string]taintMemory{tc.rule.String(): tc.mem}
			for _, s := range tc.steps {
				f := taintFacts{now: at(s.now), kubeletBoot: boot, window: 10 * time.Minute, taints: s.taints, owner: s.owner, conds: s.conds}
				var changes []taintChange
				changes, mem = decideTaints([]taintRule{tc.rule}, f, mem)
				var got []string
				for _, c := range changes {
					op := "remove"
					if c.add {
						op = "add"
					}
					got = append(got, strings.TrimSpace(op+" "+c.reason+" "+c.by))
				}
				if strings.Join(got, ";") != s.want {
					t.Fatalf("%s: changes %q, want %q", s.name, got, s.want)
				}
			}
		})
	}
}

func TestDecideTaintsKeysByKubeletBoot(t *testing.T) {
	rule := taintRule{key: "k.example.com/x", effect: corev1.TaintEffectNoSchedule, conds: []string{"c"}}
	boot := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	mem := map[string]taintMemory{rule.String(): {ready: true, removed: boot, boot: boot, reRemovals: maxReRemovals}}
	f := taintFacts{now: boot.Add(time.Minute), kubeletBoot: boot, window: 10 * time.Minute,
		taints: []corev1.Taint{{Key: rule.key, Effect: rule.effect}}, owner: taintHolder{manager: "node-manager", since: boot.Add(time.Minute)},
		conds: map[string]condNow{"c": {corev1.ConditionTrue, boot}}}
	if c, _ := decideTaints([]taintRule{rule}, f, mem); len(c) != 0 {
		t.Fatalf("past the bound: %+v", c)
	}
	// The kubelet restarted: a new boot, a new window, a new count.
	f.kubeletBoot = f.now
	f.now = f.now.Add(time.Second)
	c, next := decideTaints([]taintRule{rule}, f, mem)
	if len(c) != 1 || c[0].reason != ReasonTaintReadded || next[rule.String()].reRemovals != 1 {
		t.Errorf("after the kubelet's restart: %+v, memory %+v", c, next[rule.String()])
	}
}

func TestTaintsOwner(t *testing.T) {
	t1, t2 := metav1.NewTime(time.Unix(1000, 0)), metav1.NewTime(time.Unix(2000, 0))
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{ManagedFields: []metav1.ManagedFieldsEntry{
		{Manager: "kubelet", Operation: metav1.ManagedFieldsOperationUpdate, Time: &t1, FieldsType: "FieldsV1",
			FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:metadata":{"f:labels":{}}}`)}},
		{Manager: "node-manager", Operation: metav1.ManagedFieldsOperationUpdate, Time: &t2, FieldsType: "FieldsV1",
			FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:spec":{"f:taints":{}}}`)}},
		{Manager: "plugd", Operation: metav1.ManagedFieldsOperationUpdate, Time: &t2, Subresource: "status", FieldsType: "FieldsV1",
			FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:status":{"f:conditions":{}}}`)}},
		{Manager: "broken", Time: &t2, FieldsV1: &metav1.FieldsV1{Raw: []byte(`{`)}},
	}}}
	if h := taintsOwner(n); h.manager != "node-manager" || !h.since.Equal(t2.Time) {
		t.Errorf("taintsOwner = %+v; want node-manager at %v", h, t2)
	}
	if h := taintsOwner(&corev1.Node{}); h.manager != "" {
		t.Errorf("taintsOwner of a Node without managedFields = %+v", h)
	}
}

func TestAddTaintPatch(t *testing.T) {
	now := time.Unix(5000, 0)
	for _, existing := range [][]corev1.Taint{nil, {{Key: "other", Effect: corev1.TaintEffectNoSchedule}}} {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", ResourceVersion: "7"}, Spec: corev1.NodeSpec{Taints: existing}}
		r := taintRule{key: "k.example.com/x", effect: corev1.TaintEffectNoExecute}
		patch, err := addTaintPatch(n, r, now)
		if err != nil {
			t.Fatal(err)
		}
		p, err := jsonpatch.DecodePatch(patch)
		if err != nil {
			t.Fatal(err)
		}
		orig, _ := json.Marshal(n)
		res, err := p.Apply(orig)
		if err != nil {
			t.Fatalf("with %d taints: %v", len(existing), err)
		}
		var out corev1.Node
		if err := json.Unmarshal(res, &out); err != nil {
			t.Fatal(err)
		}
		last := out.Spec.Taints[len(out.Spec.Taints)-1]
		if len(out.Spec.Taints) != len(existing)+1 || last.Key != r.key || last.TimeAdded == nil || !last.TimeAdded.Equal(&metav1.Time{Time: now}) {
			t.Errorf("with %d taints: after the patch %+v", len(existing), out.Spec.Taints)
		}
		// The Node changed since it was read: the patch fails, nothing is added.
		n.ResourceVersion = "8"
		b, _ := json.Marshal(n)
		if _, err := p.Apply(b); err == nil {
			t.Errorf("with %d taints: the patch applied to a Node that changed", len(existing))
		}
	}
}

// slimNode keeps who last wrote the taints, so that a re-add can be told
// from the node's registration taint after the informer's copy is slimmed.
func TestSlimNodeKeepsTheTaintsOwner(t *testing.T) {
	at := metav1.NewTime(time.Unix(3000, 0))
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", ManagedFields: []metav1.ManagedFieldsEntry{
		{Manager: "node-manager", Operation: metav1.ManagedFieldsOperationUpdate, Time: &at, FieldsType: "FieldsV1",
			FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:metadata":{"f:labels":{"f:a":{}}},"f:spec":{"f:taints":{},"f:podCIDR":{}}}`)}},
		{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationUpdate, Time: &at, FieldsType: "FieldsV1",
			FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:metadata":{"f:labels":{"f:b":{}}}}`)}},
	}}}
	s, err := slimNode(n)
	if err != nil {
		t.Fatal(err)
	}
	slim := s.(*corev1.Node)
	if h := taintsOwner(slim); h.manager != "node-manager" || !h.since.Equal(at.Time) {
		t.Errorf("taintsOwner of the slim Node = %+v", h)
	}
	if len(slim.ManagedFields) != 1 || strings.Contains(string(slim.ManagedFields[0].FieldsV1.Raw), "labels") {
		t.Errorf("slim managedFields = %+v; want only the taints' writer, without its other fields", slim.ManagedFields)
	}
}

// The loop removes a plugin's own taint once it is ready, and only its
// own; removes a re-add by another writer within the window again, naming
// it; with retaint puts the taint back when the plugin fails, and removes
// it once it is ready again. Each write is one JSON patch, each with its
// event.
func TestPluginTaintsInTheLoop(t *testing.T) {
	own := corev1.Taint{Key: "csi.example.com/agent-not-ready", Effect: corev1.TaintEffectNoExecute}
	other := corev1.Taint{Key: "gpu.example.com/not-ready", Effect: corev1.TaintEffectNoSchedule}
	b := newBenchWith(t, func(c *Config) {
		c.Expect = []Expectation{
			{Type: TypeCSI, Name: "csi.example.com", Taint: own.Key + ":NoExecute", Retaint: true},
			{Type: TypeDevice, Name: "gpu.example.com/gpu", Taint: other.Key + ":NoSchedule"},
		}
	}, &corev1.Node{ObjectMeta: metav1.ObjectMeta{ResourceVersion: "1"}, // the fake API server sets none, as a real one does
		Spec: corev1.NodeSpec{Taints: []corev1.Taint{own, other}}})
	taints := func() string {
		n, err := b.cs.CoreV1().Nodes().Get(context.Background(), "node-a", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, tt := range n.Spec.Taints {
			out = append(out, tt.Key)
		}
		return strings.Join(out, ",")
	}
	events := func(from int) string {
		var out []string
		for _, e := range b.rec.got[from:] {
			if strings.Contains(e, "Taint") {
				out = append(out, e[:strings.Index(e, "]")+1])
			}
		}
		return strings.Join(out, "; ")
	}
	waitTaints := func(want string) {
		t.Helper()
		b.waitFor("the informer showing taints "+want, func() bool {
			var got []string
			for _, tt := range b.n.snapshot().node.Spec.Taints {
				got = append(got, tt.Key)
			}
			return strings.Join(got, ",") == want
		})
	}

	started := b.clock.Now().Add(-time.Minute)
	csi := csiSocket(started, true)
	b.setPlugins(csi)
	b.setKubelet(started, csi.Path)
	b.step(0)
	if got := taints(); got != other.Key {
		t.Fatalf("taints once the CSI driver is ready: %q; want only the device plugin's, which is not", got)
	}
	if got := events(0); got != "Normal TaintRemoved [Remove taint csi.example.com/agent-not-ready:NoExecute]" {
		t.Errorf("events: %s", got)
	}
	waitTaints(other.Key)

	// Another writer puts it back within the window: removed again, its
	// manager named.
	n, _ := b.cs.CoreV1().Nodes().Get(context.Background(), "node-a", metav1.GetOptions{})
	n.Spec.Taints = append(n.Spec.Taints, own)
	if _, err := b.cs.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{FieldManager: "node-manager"}); err != nil {
		t.Fatal(err)
	}
	waitTaints(other.Key + "," + own.Key)
	from := len(b.rec.got)
	b.step(5 * time.Second)
	if got := taints(); got != other.Key {
		t.Fatalf("taints after a re-add within the window: %q", got)
	}
	if got := events(from); !strings.HasPrefix(got, "Warning TaintReadded [Remove taint csi.example.com/agent-not-ready:NoExecute]") ||
		!strings.Contains(b.rec.got[len(b.rec.got)-1], "re-added by node-manager") {
		t.Errorf("events: %s (%q)", got, b.rec.got[from:])
	}
	waitTaints(other.Key)

	// retaint: the driver fails, the taint goes back; ready again, it goes.
	from = len(b.rec.got)
	b.setPlugins()
	b.step(time.Second)
	if got := taints(); got != other.Key+","+own.Key {
		t.Fatalf("taints once the CSI driver is gone: %q; want its taint back (writes %q, events %q)", got, b.writes(), b.rec.got[from:])
	}
	waitTaints(other.Key + "," + own.Key)
	b.step(time.Second)
	if got := events(from); got != "Warning TaintRestored [Add taint csi.example.com/agent-not-ready:NoExecute]" {
		t.Errorf("events: %s; want one TaintRestored", got)
	}
	back := csiSocket(b.clock.Now(), true)
	b.setPlugins(back)
	b.step(kubeletSettle)
	b.setKubelet(started, back.Path)
	b.step(time.Second)
	if got := taints(); got != other.Key {
		t.Fatalf("taints once the CSI driver is ready again: %q", got)
	}
}
