package nodecond

import (
	"encoding/json"
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
		{ObjectMeta: metav1.ObjectMeta{Name: "b"}, Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{
			cond("csi.example.com/CSIPluginReady", corev1.ConditionFalse, "SocketMissing", "CSIPlugin csi.example.com"),
			{Type: "Ready", Status: corev1.ConditionTrue, Message: "kubelet is posting ready status"},
		}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "a"}, Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{
			cond("csi.example.com/CSIPluginReady", corev1.ConditionTrue, "PluginReady", "CSIPlugin csi.example.com"),
			cond("g", corev1.ConditionTrue, "PluginReady", "DevicePlugin vendor.example/gpu"),
		}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "c"}},
	}
	got := Summarize(nodes)
	if len(got) != 2 {
		t.Fatalf("Summarize = %+v", got)
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

// A census counts node by node what Summarize counts at once, and its view
// is a copy: counting on does not change a view already taken.
func TestCensus(t *testing.T) {
	var c Census
	mine := corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "b"}, Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{
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

// A condition plugd has not written for longer than the census allows is
// left from a plugd that no longer runs: not ready, whatever it says.
func TestCensusNotMaintained(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	cond := func(age time.Duration) corev1.NodeCondition {
		return corev1.NodeCondition{Type: "g", Status: corev1.ConditionTrue, Reason: "PluginReady",
			Message: Message("DevicePlugin", "vendor.example/gpu", "ready"), LastHeartbeatTime: metav1.NewTime(now.Add(-age))}
	}
	fresh := corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "a"}, Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{cond(time.Minute)}}}
	old := corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "b"}, Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{cond(MaxHeartbeatAge + time.Second)}}}
	c := Census{Now: now}
	c.Add(&fresh)
	c.Add(&old)
	v := c.View()
	if len(v.Plugins) != 1 {
		t.Fatalf("view: %+v", v)
	}
	if p := v.Plugins[0]; p.Ready != 1 || p.Expected != 2 || len(p.NotReady) != 1 || p.NotReady[0].Node != "b" ||
		p.NotReady[0].Status != "Unknown" || p.NotReady[0].Reason != ReasonNotMaintained {
		t.Errorf("plugin: %+v", p)
	}
	// A shorter bound, as plugctl cluster --stale-after sets it.
	c = Census{Now: now, MaxAge: 30 * time.Second}
	c.Add(&fresh)
	if p := c.View().Plugins[0]; p.Ready != 0 {
		t.Errorf("a condition a minute old is maintained under a 30s bound: %+v", p)
	}
	// The zero census takes conditions as they say.
	var z Census
	z.Add(&old)
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
