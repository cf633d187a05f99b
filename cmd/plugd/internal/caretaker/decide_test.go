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
			marks, next := look(tc.n, t0, bounds{staleAfter: bound}, seen, evidence{})
			if stale := indexes(marks); !slices.Equal(stale, tc.stale) {
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
	marks, _ := look(n, t0, bounds{staleAfter: nodecond.MaxHeartbeatAge}, seen, evidence{})
	if stale := indexes(marks); !slices.Equal(stale, []int{2}) {
		t.Fatalf("stale = %v", stale)
	}
	patch, err := markPatch(n, marks[0], now)
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

// indexes are the indexes of the conditions marks are about.
func indexes(marks []mark) []int {
	var out []int
	for _, m := range marks {
		out = append(out, m.i)
	}
	return out
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
	if marks, _ := look(s, t0, bounds{staleAfter: nodecond.MaxHeartbeatAge}, map[string]sighting{}, evidence{}); !slices.Equal(indexes(marks), []int{0}) {
		t.Errorf("look at the slim copy: %v", marks)
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
				marks, next := look(n, now, bounds{staleAfter: bound}, seen, evidence{})
				if len(marks) > 0 {
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

// csiCond is a condition in plugd's form about CSIPlugin NAME, of type
// NAME/CSIPluginReady, last written age before t0.
func csiCond(name string, status corev1.ConditionStatus, age time.Duration) corev1.NodeCondition {
	c := cond(name, status, age)
	c.Type = corev1.NodeConditionType(name + "/CSIPluginReady")
	c.Message = nodecond.Message("CSIPlugin", name, "registered with the kubelet")
	return c
}

// Issue 32, item 5: the signs besides the heartbeat. plugd's pod not
// Ready or gone past the grace, or a CSI driver's True while the kubelet
// dropped the driver from CSINode past its grace, mark a condition
// PlugdNotRunning, unless plugd wrote it after the sign (then it runs,
// whatever its pod says, and only the heartbeat's bound judges it); the
// next look is when the first sign can be due.
func TestLookSigns(t *testing.T) {
	b := bounds{staleAfter: nodecond.MaxHeartbeatAge, podGrace: 40 * time.Second, csiGrace: 10 * time.Second}
	ago := func(d time.Duration) time.Time { return t0.Add(-d) }
	gone := func(driver string, d time.Duration) map[string]time.Time {
		return map[string]time.Time{driver: ago(d), "other": {}}
	}
	const pod, csi, stale = signPodDown, signCSINode, signStale
	for _, tc := range []struct {
		name   string
		c      corev1.NodeCondition
		ev     evidence
		csiOff bool
		sign   sign          // of the mark; -1: none
		next   time.Duration // after t0, when none
	}{
		{name: "pod Ready, fresh: the heartbeat's bound is next",
			c: cond("a", corev1.ConditionTrue, time.Minute), sign: -1, next: b.staleAfter - time.Minute + time.Nanosecond},
		{name: "pod down 30s: due at the grace",
			c: cond("a", corev1.ConditionTrue, 2*time.Minute), ev: evidence{podDown: ago(30 * time.Second)}, sign: -1, next: 10*time.Second + time.Nanosecond},
		{name: "pod down exactly the grace: not yet",
			c: cond("a", corev1.ConditionTrue, 2*time.Minute), ev: evidence{podDown: ago(40 * time.Second)}, sign: -1, next: time.Nanosecond},
		{name: "pod down past the grace, not written since: PlugdNotRunning",
			c: cond("a", corev1.ConditionTrue, 2*time.Minute), ev: evidence{podDown: ago(41 * time.Second)}, sign: pod},
		{name: "pod down past the grace, False: marked too (it says as little of now)",
			c: cond("a", corev1.ConditionFalse, 2*time.Minute), ev: evidence{podDown: ago(41 * time.Second)}, sign: pod},
		{name: "pod down past the grace, written after it went: plugd runs; the heartbeat judges",
			c: cond("a", corev1.ConditionTrue, 10*time.Second), ev: evidence{podDown: ago(41 * time.Second)}, sign: -1, next: b.staleAfter - 10*time.Second + time.Nanosecond},
		{name: "pod down past the grace, written the instant it went: not since",
			c: cond("a", corev1.ConditionTrue, 41*time.Second), ev: evidence{podDown: ago(41 * time.Second)}, sign: pod},
		{name: "CSI driver dropped 11s ago, True: PlugdNotRunning",
			c: csiCond("csi.example.com", corev1.ConditionTrue, time.Minute), ev: evidence{driverGone: gone("csi.example.com", 11*time.Second)}, sign: csi},
		{name: "CSI driver dropped 5s ago: due at its grace",
			c: csiCond("csi.example.com", corev1.ConditionTrue, time.Minute), ev: evidence{driverGone: gone("csi.example.com", 5*time.Second)}, sign: -1, next: 5*time.Second + time.Nanosecond},
		{name: "CSI driver dropped, False: it agrees with the kubelet",
			c: csiCond("csi.example.com", corev1.ConditionFalse, time.Minute), ev: evidence{driverGone: gone("csi.example.com", time.Minute)}, sign: -1, next: b.staleAfter - time.Minute + time.Nanosecond},
		{name: "CSI driver dropped, True written after: plugd runs (it left True while the kubelet writes CSINode)",
			c: csiCond("csi.example.com", corev1.ConditionTrue, 5*time.Second), ev: evidence{driverGone: gone("csi.example.com", time.Minute)}, sign: -1, next: b.staleAfter - 5*time.Second + time.Nanosecond},
		{name: "another driver dropped: nothing of this one",
			c: csiCond("csi.example.com", corev1.ConditionTrue, time.Minute), ev: evidence{driverGone: gone("csi.other.com", time.Minute)}, sign: -1, next: b.staleAfter - time.Minute + time.Nanosecond},
		{name: "a driver listed (zero): nothing",
			c: csiCond("csi.example.com", corev1.ConditionTrue, time.Minute), ev: evidence{driverGone: map[string]time.Time{"csi.example.com": {}}}, sign: -1, next: b.staleAfter - time.Minute + time.Nanosecond},
		{name: "a device plugin of a dropped CSI driver's name: not a CSI driver",
			c: cond("csi.example.com", corev1.ConditionTrue, time.Minute), ev: evidence{driverGone: gone("csi.example.com", time.Minute)}, sign: -1, next: b.staleAfter - time.Minute + time.Nanosecond},
		{name: "CSINode sign off",
			c: csiCond("csi.example.com", corev1.ConditionTrue, time.Minute), ev: evidence{driverGone: gone("csi.example.com", time.Minute)}, csiOff: true, sign: -1, next: b.staleAfter - time.Minute + time.Nanosecond},
		{name: "both signs: the pod's is named",
			c: csiCond("csi.example.com", corev1.ConditionTrue, time.Minute), ev: evidence{podDown: ago(50 * time.Second), driverGone: gone("csi.example.com", 30*time.Second)}, sign: pod},
		{name: "CSI due before the pod: the first due is next",
			c: csiCond("csi.example.com", corev1.ConditionTrue, time.Minute), ev: evidence{podDown: ago(10 * time.Second), driverGone: gone("csi.example.com", 5*time.Second)}, sign: -1, next: 5*time.Second + time.Nanosecond},
		{name: "pod Ready, heartbeat past its bound: NotMaintained",
			c: cond("a", corev1.ConditionTrue, 12*time.Minute), sign: stale},
		{name: "Unknown: nothing, whatever the signs",
			c: csiCond("csi.example.com", corev1.ConditionUnknown, time.Hour), ev: evidence{podDown: ago(time.Hour), driverGone: gone("csi.example.com", time.Hour)}, sign: -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bb := b
			if tc.csiOff {
				bb.csiGrace = 0
			}
			n := node([]metav1.ManagedFieldsEntry{managed("plugd", string(tc.c.Type))}, tc.c)
			marks, next := look(n, t0, bb, map[string]sighting{}, tc.ev)
			if tc.sign < 0 {
				if len(marks) != 0 {
					t.Fatalf("marked: %+v", marks)
				}
				var want time.Time
				if tc.next != 0 {
					want = t0.Add(tc.next)
				}
				if !next.Equal(want) {
					t.Errorf("next = %v, want %v", next.Sub(t0), tc.next)
				}
				return
			}
			if len(marks) != 1 || marks[0].sign != tc.sign {
				t.Fatalf("marks %+v, want one by sign %s", marks, tc.sign)
			}
			m := marks[0]
			wantReason, wantSince := nodecond.ReasonPlugdNotRunning, tc.ev.podDown
			switch tc.sign {
			case stale:
				wantReason, wantSince = nodecond.ReasonNotMaintained, tc.c.LastHeartbeatTime.Time
			case csi:
				wantSince = tc.ev.driverGone["csi.example.com"]
			}
			if m.reason != wantReason || !m.since.Equal(wantSince) {
				t.Errorf("mark %+v, want reason %s since %v", m, wantReason, wantSince)
			}
			got := unmaintained(tc.c, m, t0)
			if got.Status != corev1.ConditionUnknown || got.Reason != wantReason || !strings.Contains(got.Message, m.sign.words(m.since)) ||
				!strings.HasSuffix(got.Message, "(marked by plugd's caretaker)") {
				t.Errorf("marked as %+v", got)
			}
		})
	}
}

// What the caretaker makes of plugd's pods on a node, seen one state after
// another: a pod of the same DaemonSet Ready again before the grace ends
// (a rolling update: the old deleted, the new created, then Ready) clears
// the sign; a node where it never saw a pod has none (plugd outside a
// pod); a pod seen first not Ready counts from then.
func TestPodSighting(t *testing.T) {
	ready := func(name string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name},
			Status: corev1.PodStatus{Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}}
	}
	notReady := func(name string) *corev1.Pod {
		p := ready(name)
		p.Status.Conditions[0].Status = corev1.ConditionFalse
		return p
	}
	deleting := func(name string) *corev1.Pod {
		p := ready(name)
		p.DeletionTimestamp = &metav1.Time{Time: t0}
		return p
	}
	type step struct {
		pods []*corev1.Pod
		down time.Duration // after t0; -1: not down
	}
	for _, tc := range []struct {
		name  string
		steps []step // one a second from t0
	}{
		{"never a pod: nothing, ever", []step{{nil, -1}, {nil, -1}}},
		{"a rolling update: deleted, gone, new, Ready", []step{
			{[]*corev1.Pod{ready("old")}, -1}, {[]*corev1.Pod{deleting("old")}, time.Second}, {nil, time.Second},
			{[]*corev1.Pod{notReady("new")}, time.Second}, {[]*corev1.Pod{ready("new")}, -1}}},
		{"a surge: the new one Ready while the old goes", []step{
			{[]*corev1.Pod{ready("old")}, -1}, {[]*corev1.Pod{deleting("old"), ready("new")}, -1}, {[]*corev1.Pod{ready("new")}, -1}}},
		{"gone for good: down since it went", []step{{[]*corev1.Pod{ready("a")}, -1}, {nil, time.Second}, {nil, time.Second}}},
		{"crash-looping when first seen: from then", []step{{[]*corev1.Pod{notReady("a")}, 0}, {[]*corev1.Pod{notReady("a")}, 0}}},
		{"a pod with no Ready condition yet: not Ready", []step{{[]*corev1.Pod{ready("a")}, -1}, {[]*corev1.Pod{{}}, time.Second}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var s podSighting
			for i, st := range tc.steps {
				s = s.update(st.pods, t0.Add(time.Duration(i)*time.Second))
				var want time.Time
				if st.down >= 0 {
					want = t0.Add(st.down)
				}
				if !s.down.Equal(want) {
					t.Fatalf("step %d: down %v, want %v", i, s.down, want)
				}
			}
		})
	}
}

// The caretaker records a driver dropped from CSINode when it saw it
// listed before: not one it never saw there (plugd managing, no kubelet
// writing CSINode), and a driver listed again clears it.
func TestUpdateDrivers(t *testing.T) {
	gone := map[string]time.Time{}
	updateDrivers(gone, nil, t0)
	if len(gone) != 0 {
		t.Fatalf("nothing listed, ever: %v", gone)
	}
	updateDrivers(gone, []string{"a", "b"}, t0)
	updateDrivers(gone, []string{"b"}, t0.Add(time.Second))
	updateDrivers(gone, []string{"b"}, t0.Add(2*time.Second)) // still gone: since the first
	if !gone["a"].Equal(t0.Add(time.Second)) || !gone["b"].IsZero() {
		t.Errorf("a dropped, b listed: %v", gone)
	}
	updateDrivers(gone, nil, t0.Add(3*time.Second)) // the CSINode deleted
	updateDrivers(gone, []string{"a"}, t0.Add(4*time.Second))
	if !gone["a"].IsZero() || !gone["b"].Equal(t0.Add(3*time.Second)) {
		t.Errorf("a back, b dropped: %v", gone)
	}
}
