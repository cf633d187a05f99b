package caretaker

import (
	"encoding/json"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/plugd/plugd/internal/nodecond"
)

// fieldManager is the node agent's: the caretaker writes as plugd, so that
// the node's plugd, when it runs again, owns the condition it rewrites.
const fieldManager = nodecond.FieldManager

// look is what the caretaker does with n at now: the indexes in
// n.Status.Conditions of plugd's conditions that nobody has maintained for
// longer than staleAfter, and the earliest time another of plugd's will be
// (zero: none can go stale, nothing to look at again).
//
// A condition is plugd's when the API server's managedFields say plugd's
// field manager set it through nodes/status and its message is in plugd's
// form: a message anyone can write, so that alone never gets another's
// condition changed. One that says Unknown already claims nothing, and
// one with no heartbeat at all has no age to judge.
func look(n *corev1.Node, now time.Time, staleAfter time.Duration) (stale []int, next time.Time) {
	var mine map[string]bool
	for i, c := range n.Status.Conditions {
		if c.Status == corev1.ConditionUnknown || c.LastHeartbeatTime.IsZero() || !nodecond.Owned(c) {
			continue
		}
		if mine == nil {
			mine = nodecond.ManagedTypes(n, fieldManager)
		}
		if !mine[string(c.Type)] {
			continue
		}
		if now.Sub(c.LastHeartbeatTime.Time) > staleAfter {
			stale = append(stale, i)
			continue
		}
		// Maintained up to staleAfter inclusive, as nodecond.Maintained
		// has it: stale the instant after.
		due := c.LastHeartbeatTime.Add(staleAfter + time.Nanosecond)
		if next.IsZero() || due.Before(next) {
			next = due
		}
	}
	return stale, next
}

// unmaintained is what condition c says once the caretaker marks it, at
// now: Unknown, NotMaintained, with the plugin it is about still in its
// message (nodecond.Parse) and what it said before; its heartbeat stays
// the last one plugd wrote.
func unmaintained(c corev1.NodeCondition, now time.Time) corev1.NodeCondition {
	typ, name, _ := nodecond.Parse(c.Message)
	text := fmt.Sprintf("plugd has not maintained this condition since %s (it said %s, %s); is plugd running on this node? (marked by plugd's caretaker)",
		c.LastHeartbeatTime.UTC().Format(time.RFC3339), c.Status, c.Reason)
	return corev1.NodeCondition{
		Type: c.Type, Status: corev1.ConditionUnknown, Reason: nodecond.ReasonNotMaintained,
		Message:           nodecond.Message(typ, name, text),
		LastHeartbeatTime: c.LastHeartbeatTime, LastTransitionTime: metav1.NewTime(now),
	}
}

// markPatch is the JSON patch of n's status that marks the conditions at
// the indexes in stale unmaintained, and touches nothing else. For each,
// it first tests that the entry at that index is still the one read: the
// same type, status and heartbeat. A heartbeat plugd wrote meanwhile, or a
// list reordered, fails the patch as a whole instead of overwriting it.
func markPatch(n *corev1.Node, stale []int, now time.Time) ([]byte, error) {
	var ops []map[string]any
	for _, i := range stale {
		c := n.Status.Conditions[i]
		path := fmt.Sprintf("/status/conditions/%d", i)
		ops = append(ops,
			map[string]any{"op": "test", "path": path + "/type", "value": c.Type},
			map[string]any{"op": "test", "path": path + "/status", "value": c.Status},
			map[string]any{"op": "test", "path": path + "/lastHeartbeatTime", "value": c.LastHeartbeatTime},
			map[string]any{"op": "replace", "path": path, "value": unmaintained(c, now)},
		)
	}
	return json.Marshal(ops)
}

// slim is the part of a Node the caretaker keeps in its cache: its name,
// plugd's conditions, and the managedFields plugd's field manager has of
// its status. A Node's images, addresses and others' conditions are most
// of it.
func slim(obj any) (any, error) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil // a deletion's last known state: kept as it is
	}
	out := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name, UID: n.UID, ResourceVersion: n.ResourceVersion}}
	for _, mf := range n.ManagedFields {
		if mf.Manager == fieldManager && mf.Subresource == "status" {
			out.ManagedFields = append(out.ManagedFields, mf)
		}
	}
	for _, c := range n.Status.Conditions {
		if nodecond.Owned(c) {
			out.Status.Conditions = append(out.Status.Conditions, c)
		}
	}
	return out, nil
}
