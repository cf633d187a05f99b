package nodecond

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestSummarize(t *testing.T) {
	cond := func(typ string, status corev1.ConditionStatus, reason, plugin string) corev1.NodeCondition {
		f := strings.Fields(plugin)
		return corev1.NodeCondition{Type: corev1.NodeConditionType(typ), Status: status, Reason: reason, Message: Message(f[0], f[1], "why")}
	}
	nodes := []corev1.Node{
		{ObjectMeta: metav1.ObjectMeta{Name: "b", ManagedFields: managedBy(FieldManager, "csi.example.com/CSIPluginReady")}, Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{
			cond("csi.example.com/CSIPluginReady", corev1.ConditionFalse, "SocketMissing", "CSIPlugin csi.example.com"),
			{Type: "Ready", Status: corev1.ConditionTrue, Message: "kubelet is posting ready status"},
		}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "a", ManagedFields: managedBy(FieldManager, "csi.example.com/CSIPluginReady", "g")}, Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{
			cond("csi.example.com/CSIPluginReady", corev1.ConditionTrue, "PluginReady", "CSIPlugin csi.example.com"),
			cond("g", corev1.ConditionTrue, "PluginReady", "DevicePlugin vendor.example/gpu"),
		}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "c"}},
	}
	got := summarize(nodes)
	if len(got) != 2 {
		t.Fatalf("summarize = %+v", got)
	}
	if c := got[0]; c.Type != "CSIPlugin" || c.Ready != 1 || c.Expected != 2 || len(c.NotReady) != 1 || c.NotReady[0].Node != "b" || c.NotReady[0].Reason != "SocketMissing" {
		t.Errorf("csi: %+v", c)
	}
	if c := got[1]; c.Name != "vendor.example/gpu" || c.Ready != 1 || c.Expected != 1 {
		t.Errorf("gpu: %+v", c)
	}
}

// A disagreement between the socket and the kubelet is told once, after the
// grace; a device plugin that went, whose capacity the kubelet keeps for its
// own grace period with nothing allocatable, is no disagreement.

// A census counts node by node what summarize counts at once, and its view
// is a copy: counting on does not change a view already taken.
func TestCensus(t *testing.T) {
	var c Census
	mine := corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "b", ManagedFields: managedBy(FieldManager, "x/CSIPluginReady")}, Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{
		{Type: "x/CSIPluginReady", Status: corev1.ConditionFalse, Message: Message("CSIPlugin", "x", "no socket")}}}}
	other := corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "a"}}
	c.Add(&mine)
	c.Add(&other)
	v := c.View()
	if v.Nodes != 2 || v.NodesWithPlugd != 1 || len(v.Plugins) != 1 || v.Plugins[0].Expected != 1 || len(v.Plugins[0].NotReady) != 1 {
		t.Fatalf("view %+v", v)
	}
	mine.Name = "a-too"
	c.Add(&mine)
	if len(v.Plugins[0].NotReady) != 1 {
		t.Errorf("a view taken earlier changed: %+v", v.Plugins[0])
	}
	if w := c.View(); w.Nodes != 3 || w.Plugins[0].Expected != 2 || w.Plugins[0].NotReady[0].Node != "a-too" {
		t.Errorf("view after a third node: %+v", w)
	}
}

// A condition on a Node whose status plugd has not written for longer than
// the census allows, by the API server's record (managedFields), is left
// from a plugd that no longer runs: not ready, whatever it says. Issue 33,
// item 3: the heartbeat, the node's clock, is not the judge. A heartbeat
// 20 minutes in the past, plugd writing: maintained; one 20 minutes in the
// future, plugd stopped 12 minutes ago: not maintained.
func TestCensusNotMaintained(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	node := func(name string, heartbeat, written time.Duration, status corev1.ConditionStatus) *corev1.Node {
		mf := managedBy(FieldManager, "g")
		mf[0].Time = &metav1.Time{Time: now.Add(-written)}
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, ManagedFields: mf}, Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{
			Type: "g", Status: status, Reason: "PluginReady",
			Message: Message("DevicePlugin", "vendor.example/gpu", "ready"), LastHeartbeatTime: metav1.NewTime(now.Add(-heartbeat))}}}}
	}
	for _, tc := range []struct {
		name       string
		n          *corev1.Node
		maxAge     time.Duration
		maintained bool
	}{
		{"written a minute ago", node("a", time.Minute, time.Minute, corev1.ConditionTrue), 0, true},
		{"written past the bound", node("a", MaxHeartbeatAge+time.Second, MaxHeartbeatAge+time.Second, corev1.ConditionTrue), 0, false},
		{"a node clock 20 minutes behind, plugd writing", node("a", 20*time.Minute, time.Minute, corev1.ConditionTrue), 0, true},
		{"a node clock 20 minutes ahead, plugd stopped", node("a", -20*time.Minute, 12*time.Minute, corev1.ConditionTrue), 0, false},
		{"a shorter bound, as plugctl cluster --stale-after sets it", node("a", time.Minute, time.Minute, corev1.ConditionTrue), 30 * time.Second, false},
		{"no record of the write: nothing says it is not maintained", func() *corev1.Node {
			n := node("a", 20*time.Minute, 0, corev1.ConditionTrue)
			n.ManagedFields[0].Time = nil
			return n
		}(), 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Census{Now: now, MaxAge: tc.maxAge}
			c.Add(tc.n)
			p := c.View().Plugins[0]
			switch {
			case tc.maintained && p.Ready != 1:
				t.Errorf("not maintained: %+v", p)
			case !tc.maintained && (p.Ready != 0 || len(p.NotReady) != 1 || p.NotReady[0].Status != "Unknown" || p.NotReady[0].Reason != ReasonNotMaintained ||
				!strings.Contains(p.NotReady[0].Message, "since "+tc.n.ManagedFields[0].Time.UTC().Format(time.RFC3339))):
				t.Errorf("maintained: %+v", p)
			}
		})
	}
	// The zero census takes conditions as they say.
	var z Census
	z.Add(node("b", time.Hour, time.Hour, corev1.ConditionTrue))
	if p := z.View().Plugins[0]; p.Ready != 1 {
		t.Errorf("the zero census: %+v", p)
	}
}

// A message is what the API server stores, whatever the text quotes: valid
// UTF-8 that comes back from JSON as it went, escaped, at most MaxMessage
// bytes, wherever the cut falls among multi-byte characters.
func TestMessageIsWhatTheAPIStores(t *testing.T) {
	for shift := range 6 {
		text := "CSINode node-a lists the driver with nodeID " + strings.Repeat("x", shift) + strings.Repeat("\x01é\u202e", 200)
		m := Message("CSIPlugin", "csi.example.com", text)
		b, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		var back string
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatal(err)
		}
		if back != m || !utf8.ValidString(m) || len(m) > MaxMessage || strings.ContainsAny(m, "\x01\u202e") {
			t.Errorf("shift %d: message of %d bytes (valid UTF-8 %v) comes back from JSON the same: %v; %q", shift, len(m), utf8.ValidString(m), back == m, m[len(m)-20:])
		}
		if typ, name, ok := Parse(m); !ok || typ != "CSIPlugin" || name != "csi.example.com" {
			t.Errorf("Parse(%q) = %q %q %v", m, typ, name, ok)
		}
	}
}

// managedBy is the managedFields entry the API server records when manager
// sets conditions of these types through nodes/status.
func managedBy(manager string, types ...string) []metav1.ManagedFieldsEntry {
	conds := map[string]any{}
	for _, typ := range types {
		k, _ := json.Marshal(map[string]string{"type": typ})
		conds["k:"+string(k)] = map[string]any{".": map[string]any{}, "f:message": map[string]any{}, "f:status": map[string]any{}, "f:type": map[string]any{}}
	}
	raw, _ := json.Marshal(map[string]any{"f:status": map[string]any{"f:conditions": conds}})
	return []metav1.ManagedFieldsEntry{{Manager: manager, Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1",
		FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: raw}, Subresource: "status"}}
}

// Issue 25, item 11: a condition in plugd's form is plugd's only where the
// managedFields say plugd's field manager set it. Another writer's copy of
// the form (anyone may update a Node's status), or one plugd set through
// the Node rather than its status, or managedFields that do not parse, are
// not counted, and the node is not one with plugd.
func TestConditionsAreWhatPlugdSet(t *testing.T) {
	cond := func(typ string, status corev1.ConditionStatus) corev1.NodeCondition {
		return corev1.NodeCondition{Type: corev1.NodeConditionType(typ), Status: status, Reason: "R", Message: Message("CSIPlugin", typ, "why")}
	}
	mf := append(managedBy(FieldManager, "mine"), managedBy("kubectl-edit", "forged")...)
	mf = append(mf, metav1.ManagedFieldsEntry{Manager: FieldManager, FieldsV1: mf[0].FieldsV1}) // not through status
	mf[len(mf)-1].FieldsV1 = &metav1.FieldsV1{Raw: []byte(`{"f:status":{"f:conditions":{"k:{\"type\":\"main\"}":{}}}}`)}
	mf = append(mf, metav1.ManagedFieldsEntry{Manager: FieldManager, Subresource: "status", FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:status":`)}})
	n := corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "a", ManagedFields: mf}, Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{
		cond("mine", corev1.ConditionTrue), cond("forged", corev1.ConditionFalse), cond("main", corev1.ConditionFalse),
		{Type: "mine-too", Status: corev1.ConditionTrue, Message: "not in plugd's form"},
	}}}
	got := Conditions(&n)
	if len(got) != 1 || got[0].Type != "mine" {
		t.Errorf("Conditions = %+v, want only the one plugd set", got)
	}
	var c Census
	c.Add(&n)
	if v := c.View(); len(v.Plugins) != 1 || v.Plugins[0].Name != "mine" || v.Plugins[0].Expected != 1 {
		t.Errorf("census: %+v", v)
	}
	// A second entry of a type (a status PUT made it) is not a second
	// plugin: the first is the one plugd keeps.
	n.Status.Conditions = append(n.Status.Conditions, cond("mine", corev1.ConditionFalse))
	if got := Conditions(&n); len(got) != 1 || got[0].Status != corev1.ConditionTrue {
		t.Errorf("with a duplicate entry: Conditions = %+v, want the first entry only", got)
	}
	c = Census{}
	c.Add(&n)
	if v := c.View(); len(v.Plugins) != 1 || v.Plugins[0].Expected != 1 || v.Plugins[0].Ready != 1 {
		t.Errorf("census with a duplicate entry: %+v", v)
	}
	n.ManagedFields = managedBy("kubectl-edit", "mine", "forged")
	c = Census{}
	c.Add(&n)
	if v := c.View(); len(v.Plugins) != 0 || v.NodesWithPlugd != 0 {
		t.Errorf("a node where only another manager wrote plugd's form: %+v", v)
	}
}

// summarize tells, from the nodes' conditions, each expected plugin's
// readiness across them, as a census of them all at once does.
func summarize(nodes []corev1.Node) []ClusterPlugin {
	var c Census
	for i := range nodes {
		c.Add(&nodes[i])
	}
	return c.View().Plugins
}

// A summary round-trips; one whose lists of nodes would pass
// MaxSummaryBytes keeps its counts and drops the lists (Complete false);
// what is not a summary, or too large, is refused.
func TestSummaryEncoding(t *testing.T) {
	at := time.Date(2026, 12, 7, 5, 0, 0, 0, time.UTC)
	small := Summary{Time: at, View: ClusterView{Nodes: 2, Plugins: []ClusterPlugin{{Type: "CSIPlugin", Name: "a", Ready: 1, Expected: 2,
		NotReady: []NodeCondition{{Node: "n1", Status: "False", Reason: "SocketMissing"}}}}}}
	b, err := EncodeSummary(small)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeSummary(b)
	if err != nil || !got.Complete || !got.Time.Equal(at) || len(got.View.Plugins[0].NotReady) != 1 {
		t.Fatalf("round trip: %+v, %v", got, err)
	}
	// A message of another writer's, a megabyte long, is cut; the
	// caller's view is left as it was.
	hostile := small
	hostile.View.Plugins = []ClusterPlugin{{Type: "CSIPlugin", Name: "a", Expected: 1,
		NotReady: []NodeCondition{{Node: "n1", Status: "False", Reason: "R", Message: strings.Repeat("\x7f", 1<<20)}}}}
	b, err = EncodeSummary(hostile)
	if err != nil {
		t.Fatal(err)
	}
	got, err = DecodeSummary(b)
	if err != nil || !got.Complete || len(got.View.Plugins[0].NotReady[0].Message) > MaxMessage || len(hostile.View.Plugins[0].NotReady[0].Message) != 1<<20 {
		t.Errorf("a summary with a megabyte message: complete %v, message of %d bytes, %v", got.Complete, len(got.View.Plugins[0].NotReady[0].Message), err)
	}
	// A reason with DEL and C1 controls (the API server takes them in a
	// condition; YAML, which parses a server-side apply, does not) is
	// written escaped, and reads back as it was.
	controls := small
	controls.View.Plugins = []ClusterPlugin{{Type: "CSIPlugin", Name: "a", Expected: 1,
		NotReady: []NodeCondition{{Node: "n1", Status: "False", Reason: "R\x7f\u0085\u009b\ufffe", Message: "m\u0080"}}}}
	b, err = EncodeSummary(controls)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.ContainsFunc(b, func(r rune) bool { return r >= 0x7f && r <= 0x9f || r == 0xfffe }) {
		t.Errorf("the summary holds characters YAML refuses: %q", b)
	}
	got, err = DecodeSummary(b)
	if err != nil || !reflect.DeepEqual(got.View, controls.View) {
		t.Errorf("control characters do not come back: %+v, %v", got.View, err)
	}
	big := small
	big.View.Plugins = []ClusterPlugin{{Type: "CSIPlugin", Name: "a", Expected: 10000}}
	for i := range 10000 {
		big.View.Plugins[0].NotReady = append(big.View.Plugins[0].NotReady, NodeCondition{Node: fmt.Sprintf("node-%05d", i), Status: "False", Reason: "SocketMissing", Message: strings.Repeat("m", 100)})
	}
	b, err = EncodeSummary(big)
	if err != nil || len(b) > MaxSummaryBytes {
		t.Fatalf("a summary of 10,000 nodes not ready: %d bytes, %v", len(b), err)
	}
	got, err = DecodeSummary(b)
	if err != nil || got.Complete || got.View.Plugins[0].Expected != 10000 || got.View.Plugins[0].NotReady != nil || len(big.View.Plugins[0].NotReady) != 10000 {
		t.Errorf("a summary too large for its lists: complete %v, %+v, %v (the caller's lists: %d)", got.Complete, got.View.Plugins[0].Expected, err, len(big.View.Plugins[0].NotReady))
	}
	for _, bad := range []string{"", "{", `{"view":{}}`, `{"time":"2026-12-07T05:00:00Z","pad":"` + strings.Repeat("x", MaxSummaryBytes) + `"}`} {
		if _, err := DecodeSummary([]byte(bad)); err == nil {
			t.Errorf("DecodeSummary(%.40q) accepts it", bad)
		}
	}
}

// Holder reads the plugin a resource's condition is held by from the
// message plugd writes, and nothing from any other.
func TestHolder(t *testing.T) {
	for _, tc := range []struct{ m, typ, name string }{
		{Message("anyOf", "gpu.example.com", HeldBy+"DRAPlugin gpu.example.com: registered with the kubelet"), "DRAPlugin", "gpu.example.com"},
		{Message("anyOf", "example.com/gpu", HeldBy+"DevicePlugin example.com/gpu: registered, 2 healthy devices"), "DevicePlugin", "example.com/gpu"},
		{Message("anyOf", "gpu.example.com", "none ready: DevicePlugin example.com/gpu: no socket (SocketMissing)"), "", ""},
		{Message("CSIPlugin", "csi.example.com", "held by nobody"), "", ""},
		{"held by DRAPlugin gpu.example.com: not plugd's", "", ""},
	} {
		typ, name, ok := Holder(tc.m)
		if typ != tc.typ || name != tc.name || ok != (tc.typ != "") {
			t.Errorf("Holder(%q) = %q %q %v; want %q %q", tc.m, typ, name, ok, tc.typ, tc.name)
		}
	}
}
