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

// sighting is when the caretaker saw a condition's heartbeat take the
// value it has, on the caretaker's own clock.
type sighting struct {
	heartbeat time.Time // the value: the node's clock, compared, never measured
	at        time.Time
}

// look is what the caretaker does with n at now: the indexes in
// n.Status.Conditions of plugd's conditions whose heartbeat nobody has
// changed for longer than staleAfter, and the earliest time another of
// plugd's will be (zero: none can go stale, nothing to look at again).
//
// The age is the caretaker's own: seen holds, by condition type, when it
// saw each heartbeat take its value, and look records there what changed
// (and forgets the types n no longer has). A heartbeat is the node's
// clock: held against the caretaker's, a node 20 minutes behind would have
// its live plugd's conditions marked at every write, and plugd and the
// caretaker overwrite each other; one 20 minutes ahead would keep a dead
// plugd's True 20 minutes longer. So the node lifecycle controller judges
// the kubelet's heartbeat, and so does the caretaker. A heartbeat seen for
// the first time (the caretaker started, or the condition is new) is taken
// as written when the API server recorded plugd's last write of the
// Node's status (nodecond.LastWrite, its clock), or now if that is later:
// a caretaker that restarts marks a plugd that died long before at once,
// and a skewed node's heartbeat counts for nothing.
//
// A condition is plugd's when the API server's managedFields say plugd's
// field manager set it through nodes/status and its message is in plugd's
// form: a message anyone can write, so that alone never gets another's
// condition changed. One that says Unknown already claims nothing, and
// one with no heartbeat at all has no age to judge.
func look(n *corev1.Node, now time.Time, staleAfter time.Duration, seen map[string]sighting) (stale []int, next time.Time) {
	var mine map[string]bool
	firstSeen := now
	if w := nodecond.LastWrite(n, fieldManager); !w.IsZero() && w.Before(now) {
		firstSeen = w
	}
	present := map[string]bool{}
	for i, c := range n.Status.Conditions {
		if c.Status == corev1.ConditionUnknown || c.LastHeartbeatTime.IsZero() || !nodecond.Owned(c) {
			continue
		}
		if mine == nil {
			mine = nodecond.ManagedTypes(n, fieldManager)
		}
		typ := string(c.Type)
		if !mine[typ] || present[typ] {
			continue
		}
		present[typ] = true
		s, ok := seen[typ]
		switch {
		case !ok:
			s = sighting{c.LastHeartbeatTime.Time, firstSeen}
		case !s.heartbeat.Equal(c.LastHeartbeatTime.Time):
			s = sighting{c.LastHeartbeatTime.Time, now}
		}
		seen[typ] = s
		if now.Sub(s.at) > staleAfter {
			stale = append(stale, i)
			continue
		}
		// Maintained up to staleAfter inclusive, as nodecond.Maintained
		// has it: stale the instant after.
		due := s.at.Add(staleAfter + time.Nanosecond)
		if next.IsZero() || due.Before(next) {
			next = due
		}
	}
	for typ := range seen {
		if !present[typ] {
			delete(seen, typ)
		}
	}
	return stale, next
}

// unmaintained is what condition c says once the caretaker marks it, at
// now, having seen its heartbeat last change at since: Unknown,
// NotMaintained, with the plugin it is about still in its message
// (nodecond.Parse) and what it said before; its heartbeat stays the last
// one plugd wrote.
func unmaintained(c corev1.NodeCondition, since, now time.Time) corev1.NodeCondition {
	typ, name, _ := nodecond.Parse(c.Message)
	text := fmt.Sprintf("plugd has not maintained this condition since %s by the caretaker's clock (it said %s, %s; its last heartbeat, by the node's clock, %s); is plugd running on this node? (marked by plugd's caretaker)",
		since.UTC().Format(time.RFC3339), c.Status, c.Reason, c.LastHeartbeatTime.UTC().Format(time.RFC3339))
	return corev1.NodeCondition{
		Type: c.Type, Status: corev1.ConditionUnknown, Reason: nodecond.ReasonNotMaintained,
		Message:           nodecond.Message(typ, name, text),
		LastHeartbeatTime: c.LastHeartbeatTime, LastTransitionTime: metav1.NewTime(now),
	}
}

// markPatch is the JSON patch of n's status that marks the condition at
// index i unmaintained (seen: look's), and touches nothing else. It first
// tests that the entry at that index is still the one read: the same
// type, status and heartbeat. A heartbeat plugd wrote meanwhile, or a list
// reordered, fails the patch instead of overwriting it. One condition a
// patch: an admission policy that refuses one (its type no longer listed
// as plugd's) refuses that mark alone, not the others with it.
func markPatch(n *corev1.Node, i int, now time.Time, seen map[string]sighting) ([]byte, error) {
	c := n.Status.Conditions[i]
	path := fmt.Sprintf("/status/conditions/%d", i)
	return json.Marshal([]map[string]any{
		{"op": "test", "path": path + "/type", "value": c.Type},
		{"op": "test", "path": path + "/status", "value": c.Status},
		{"op": "test", "path": path + "/lastHeartbeatTime", "value": c.LastHeartbeatTime},
		{"op": "replace", "path": path, "value": unmaintained(c, seen[string(c.Type)].at, now)},
	})
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
