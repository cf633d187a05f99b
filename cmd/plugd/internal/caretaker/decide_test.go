package caretaker

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/plugd/plugd/internal/nodecond"
)

var t0 = time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)

// cond is a condition in plugd's form about DevicePlugin NAME, of type
// NAME/Ready, last written age before t0.
func cond(name string, status corev1.ConditionStatus, age time.Duration) corev1.NodeCondition {
	return corev1.NodeCondition{Type: corev1.NodeConditionType(name + "/Ready"), Status: status, Reason: "PluginReady",
		Message:           nodecond.Message("DevicePlugin", name, "registered"),
		LastHeartbeatTime: metav1.NewTime(t0.Add(-age)), LastTransitionTime: metav1.NewTime(t0.Add(-time.Hour))}
}

// managed is the managedFields entry of manager, through nodes/status,
// that holds the conditions of types.
func managed(manager string, types ...string) metav1.ManagedFieldsEntry {
	items := map[string]any{}
	for _, typ := range types {
		k, _ := json.Marshal(map[string]string{"type": typ})
		items["k:"+string(k)] = map[string]any{".": map[string]any{}, "f:status": map[string]any{}}
	}
	raw, _ := json.Marshal(map[string]any{"f:status": map[string]any{"f:conditions": items}})
	return metav1.ManagedFieldsEntry{Manager: manager, Operation: metav1.ManagedFieldsOperationUpdate, Subresource: "status",
		FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: raw}}
}

// node is node-a with conditions conds and managedFields mf; an entry of
// mf without a time gets, as the API server's record of plugd's last
// write, the newest heartbeat of conds: the node's clock and the API
// server's agree.
func node(mf []metav1.ManagedFieldsEntry, conds ...corev1.NodeCondition) *corev1.Node {
	var last time.Time
	for _, c := range conds {
		if c.LastHeartbeatTime.After(last) {
			last = c.LastHeartbeatTime.Time
		}
	}
	for i := range mf {
		if mf[i].Time == nil && !last.IsZero() {
			mf[i].Time = &metav1.Time{Time: last}
		}
	}
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", ManagedFields: mf}, Status: corev1.NodeStatus{Conditions: conds}}
}

// Which conditions the caretaker marks, and when it looks again: only
// plugd's (its field manager set it, and the message is in its form), not
// Unknown, with a heartbeat older than the bound; the next look is when
// the first of the others passes it.
func TestLook(t *testing.T) {
	const bound = nodecond.MaxHeartbeatAge
	kubelet := corev1.NodeCondition{Type: "Ready", Status: corev1.ConditionTrue, Message: "kubelet is posting ready status",
		LastHeartbeatTime: metav1.NewTime(t0.Add(-time.Hour))}
	for _, tc := range []struct {
		name  string
		n     *corev1.Node
		seen  map[string]sighting
		stale []int
		next  time.Duration // after t0; 0: none
	}{
		{name: "fresh: looked at again when it can go stale",
			n:    node([]metav1.ManagedFieldsEntry{managed("plugd", "a/Ready")}, cond("a", corev1.ConditionTrue, time.Minute)),
			next: bound - time.Minute + time.Nanosecond},
		{name: "a rolling restart: the new plugd heartbeats within 5 minutes, long before the bound",
			n:    node([]metav1.ManagedFieldsEntry{managed("plugd", "a/Ready")}, cond("a", corev1.ConditionTrue, 5*time.Minute+30*time.Second)),
			next: bound - 5*time.Minute - 30*time.Second + time.Nanosecond},
		{name: "exactly at the bound: still maintained",
			n:    node([]metav1.ManagedFieldsEntry{managed("plugd", "a/Ready")}, cond("a", corev1.ConditionTrue, bound)),
			next: time.Nanosecond},
		{name: "past the bound: True is marked",
			n:     node([]metav1.ManagedFieldsEntry{managed("plugd", "a/Ready")}, cond("a", corev1.ConditionTrue, bound+time.Nanosecond)),
			stale: []int{0}},
		{name: "False is marked too: it says as much about now",
			n:     node([]metav1.ManagedFieldsEntry{managed("plugd", "a/Ready")}, cond("a", corev1.ConditionFalse, 20*time.Minute)),
			stale: []int{0}},
		{name: "Unknown is left: it claims nothing (and is what the caretaker writes)",
			n: node([]metav1.ManagedFieldsEntry{managed("plugd", "a/Ready")}, cond("a", corev1.ConditionUnknown, 20*time.Minute))},
		{name: "plugd's message, another's field manager: not plugd's",
			n: node([]metav1.ManagedFieldsEntry{managed("kubectl-edit", "a/Ready")}, cond("a", corev1.ConditionTrue, 20*time.Minute))},
		{name: "plugd's field manager, another's message: not plugd's",
			n: node([]metav1.ManagedFieldsEntry{managed("plugd", "Ready")}, kubelet)},
		{name: "set by plugd on the Node itself, not its status: not plugd's",
			n: func() *corev1.Node {
				mf := managed("plugd", "a/Ready")
				mf.Subresource = ""
				return node([]metav1.ManagedFieldsEntry{mf}, cond("a", corev1.ConditionTrue, 20*time.Minute))
			}()},
		{name: "no heartbeat: no age to judge",
			n: node([]metav1.ManagedFieldsEntry{managed("plugd", "a/Ready")}, func() corev1.NodeCondition {
				c := cond("a", corev1.ConditionTrue, 0)
				c.LastHeartbeatTime = metav1.Time{}
				return c
			}())},
		{name: "among others': the stale ones by index, the next of the fresh ones, as the caretaker saw them change",
			n: node([]metav1.ManagedFieldsEntry{managed("plugd", "a/Ready", "b/Ready", "c/Ready", "d/Ready"), managed("kubelet", "Ready")},
				kubelet, cond("a", corev1.ConditionTrue, 12*time.Minute), cond("b", corev1.ConditionTrue, 2*time.Minute),
				cond("c", corev1.ConditionFalse, 3*time.Minute), cond("d", corev1.ConditionTrue, time.Hour)),
			seen: map[string]sighting{"a/Ready": {t0.Add(-12 * time.Minute), t0.Add(-12 * time.Minute)},
				"b/Ready": {t0.Add(-2 * time.Minute), t0.Add(-2 * time.Minute)}, "c/Ready": {t0.Add(-3 * time.Minute), t0.Add(-3 * time.Minute)},
				"d/Ready": {t0.Add(-time.Hour), t0.Add(-time.Hour)}},
			stale: []int{1, 4}, next: bound - 3*time.Minute + time.Nanosecond},
		{name: "first seen: as written when the API server recorded plugd's last write",
			n: node([]metav1.ManagedFieldsEntry{managed("plugd", "a/Ready", "b/Ready")},
				cond("a", corev1.ConditionTrue, 12*time.Minute), cond("b", corev1.ConditionTrue, 30*time.Minute)),
			stale: []int{0, 1}},
		{name: "first seen, the record of the write later than now (the caretaker's clock behind the API server's): now",
			n:    node([]metav1.ManagedFieldsEntry{withTime(managed("plugd", "a/Ready"), t0.Add(time.Hour))}, cond("a", corev1.ConditionTrue, time.Hour)),
			next: bound + time.Nanosecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			seen := tc.seen
			if seen == nil {
				seen = map[string]sighting{}
			}
			stale, next := look(tc.n, t0, bound, seen)
			if !slices.Equal(stale, tc.stale) {
				t.Errorf("stale = %v, want %v", stale, tc.stale)
			}
			var want time.Time
			if tc.next != 0 {
				want = t0.Add(tc.next)
			}
			if !next.Equal(want) {
				t.Errorf("next = %v, want %v", next, want)
			}
		})
	}
}

// The patch marks the stale condition, and only it, as the API server
// applies it: Unknown, NotMaintained, the same plugin in its message, the
// heartbeat as it was, the transition now. If the condition changed after
// it was read (plugd heartbeat it), the patch does not apply.
func TestMarkPatch(t *testing.T) {
	kubelet := corev1.NodeCondition{Type: "Ready", Status: corev1.ConditionTrue, Reason: "KubeletReady", Message: "kubelet is posting ready status",
		LastHeartbeatTime: metav1.NewTime(t0.Add(-time.Hour))}
	n := node([]metav1.ManagedFieldsEntry{managed("plugd", "a/Ready", "vendor.example/gpu/Ready")}, kubelet,
		cond("a", corev1.ConditionTrue, time.Minute), cond("vendor.example/gpu", corev1.ConditionTrue, 20*time.Minute))
	now := t0.Add(time.Second)
	seen := map[string]sighting{"a/Ready": {t0.Add(-time.Minute), t0.Add(-time.Minute)},
		"vendor.example/gpu/Ready": {t0.Add(-20 * time.Minute), t0.Add(-20 * time.Minute)}}
	stale, _ := look(n, t0, nodecond.MaxHeartbeatAge, seen)
	if !slices.Equal(stale, []int{2}) {
		t.Fatalf("stale = %v", stale)
	}
	patch, err := markPatch(n, stale[0], now, seen)
	if err != nil {
		t.Fatal(err)
	}
	p, err := jsonpatch.DecodePatch(patch)
	if err != nil {
		t.Fatal(err)
	}
	doc, _ := json.Marshal(n)
	out, err := p.Apply(doc)
	if err != nil {
		t.Fatalf("applying %s: %v", patch, err)
	}
	var got corev1.Node
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Status.Conditions) != 3 || !equalCond(got.Status.Conditions[0], n.Status.Conditions[0]) || !equalCond(got.Status.Conditions[1], n.Status.Conditions[1]) {
		t.Errorf("others changed:\n%+v\nwas\n%+v", got.Status.Conditions, n.Status.Conditions)
	}
	c := got.Status.Conditions[2]
	typ, name, ok := nodecond.Parse(c.Message)
	if c.Type != "vendor.example/gpu/Ready" || c.Status != corev1.ConditionUnknown || c.Reason != nodecond.ReasonNotMaintained ||
		!ok || typ != "DevicePlugin" || name != "vendor.example/gpu" ||
		!strings.Contains(c.Message, "since "+t0.Add(-20*time.Minute).Format(time.RFC3339)+" by the caretaker's clock (it said True, PluginReady; its last heartbeat, by the node's clock, "+t0.Add(-20*time.Minute).Format(time.RFC3339)+")") ||
		!c.LastHeartbeatTime.Equal(&n.Status.Conditions[2].LastHeartbeatTime) || !c.LastTransitionTime.Time.Equal(now.Truncate(time.Second)) {
		t.Errorf("marked: %+v", c)
	}

	// plugd wrote a heartbeat after the read: the test fails.
	fresh := n.DeepCopy()
	fresh.Status.Conditions[2].LastHeartbeatTime = metav1.NewTime(t0)
	doc, _ = json.Marshal(fresh)
	if out, err := p.Apply(doc); err == nil {
		t.Errorf("the patch applied over a fresh heartbeat:\n%s", out)
	}
	// Or the list moved under it.
	moved := node(n.ManagedFields, n.Status.Conditions[2], n.Status.Conditions[0], n.Status.Conditions[1])
	doc, _ = json.Marshal(moved)
	if out, err := p.Apply(doc); err == nil {
		t.Errorf("the patch applied to a reordered list:\n%s", out)
	}
}

func equalCond(a, b corev1.NodeCondition) bool {
	return fmt.Sprint(a) == fmt.Sprint(b)
}

// The cache keeps of a Node its name, plugd's conditions and what plugd's
// field manager set of its status: enough for look to say the same.
func TestSlim(t *testing.T) {
	n := node([]metav1.ManagedFieldsEntry{managed("plugd", "a/Ready"), managed("kubelet", "Ready")},
		corev1.NodeCondition{Type: "Ready", Status: corev1.ConditionTrue, Message: "kubelet is posting ready status"},
		cond("a", corev1.ConditionTrue, 20*time.Minute))
	n.Status.Images = []corev1.ContainerImage{{Names: []string{"big"}, SizeBytes: 1 << 30}}
	n.Labels = map[string]string{"x": "y"}
	obj, err := slim(n)
	if err != nil {
		t.Fatal(err)
	}
	s := obj.(*corev1.Node)
	if s.Name != "node-a" || len(s.Status.Conditions) != 1 || s.Status.Conditions[0].Type != "a/Ready" ||
		len(s.ManagedFields) != 1 || s.ManagedFields[0].Manager != "plugd" || len(s.Status.Images) != 0 || s.Labels != nil {
		t.Errorf("slim: %+v", s)
	}
	if stale, _ := look(s, t0, nodecond.MaxHeartbeatAge, map[string]sighting{}); !slices.Equal(stale, []int{0}) {
		t.Errorf("look at the slim copy: %v", stale)
	}
	tomb := cache.DeletedFinalStateUnknown{Key: "node-a"}
	if got, _ := slim(tomb); got != any(tomb) {
		t.Errorf("a tombstone changed: %v", got)
	}
}

func withTime(mf metav1.ManagedFieldsEntry, at time.Time) metav1.ManagedFieldsEntry {
	mf.Time = &metav1.Time{Time: at}
	return mf
}

// Issue 33, item 3: the caretaker judges a heartbeat by when it saw it
// change, on its own clock, as the node lifecycle controller judges the
// kubelet's. Each case runs an hour of the caretaker's clock in steps of a
// second: plugd, if it runs, writes every 5 minutes a heartbeat of its
// node's clock (skew off the caretaker's), which the API server records
// on its own clock (the caretaker's). Before, a node 20 minutes behind had
// its live plugd's conditions marked at every write (the two overwrote
// each other), and one 20 minutes ahead kept a dead plugd's True for 31
// minutes.
func TestLookClockSkew(t *testing.T) {
	const (
		bound = nodecond.MaxHeartbeatAge
		never = -1
	)
	for _, tc := range []struct {
		name    string
		skew    time.Duration // the node's clock minus the caretaker's
		stopped time.Duration // plugd's last write, after the start; 0: it keeps writing
		marked  time.Duration // when the condition is first stale, after the start
	}{
		{name: "20 minutes behind, plugd writing: never marked", skew: -20 * time.Minute, marked: never},
		{name: "20 minutes ahead, plugd writing: never marked", skew: 20 * time.Minute, marked: never},
		{name: "20 minutes ahead, plugd stopped: marked at the bound", skew: 20 * time.Minute, stopped: 10 * time.Minute, marked: 10*time.Minute + bound + time.Second},
		{name: "20 minutes behind, plugd stopped: marked at the bound, not at once", skew: -20 * time.Minute, stopped: 10 * time.Minute, marked: 10*time.Minute + bound + time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var n *corev1.Node
			write := func(at time.Time) {
				n = node([]metav1.ManagedFieldsEntry{withTime(managed("plugd", "a/Ready"), at)}, cond("a", corev1.ConditionTrue, t0.Sub(at.Add(tc.skew))))
			}
			write(t0)
			seen := map[string]sighting{}
			marked := time.Duration(never)
			for d := time.Duration(0); d <= time.Hour; d += time.Second {
				now := t0.Add(d)
				if d%(5*time.Minute) == 0 && (tc.stopped == 0 || d <= tc.stopped) {
					write(now)
				}
				stale, next := look(n, now, bound, seen)
				if len(stale) > 0 {
					marked = d
					break
				}
				if next.IsZero() || !next.After(now) {
					t.Fatalf("at %s: next look %v", d, next)
				}
			}
			if marked != tc.marked {
				t.Errorf("marked %s after the start; want %s (-1ns: never)", marked, tc.marked)
			}
		})
	}
}
