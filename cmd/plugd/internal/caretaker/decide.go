package caretaker

import (
	"encoding/json"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/plugd/plugd/api"
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

// bounds are how long each sign that plugd no longer maintains a
// condition may stand before the caretaker acts on it.
type bounds struct {
	// staleAfter: the condition's heartbeat unchanged (the last resort,
	// wherever plugd runs).
	staleAfter time.Duration
	// podGrace: plugd's pod on the node not Ready, or gone, and the
	// condition not written since. Longer than a rolling update's gap
	// between the old pod and the new one.
	podGrace time.Duration
	// csiGrace: a CSI driver whose condition says True dropped by the
	// kubelet from the node's CSINode, and the condition not written
	// since (a live plugd writes False within a second). Longer than the
	// moment the kubelet drops a driver while it registers it again.
	// Zero: the sign is not used.
	csiGrace time.Duration
}

// evidence is what the caretaker saw of a Node's plugd besides its
// heartbeats, on its own clock.
type evidence struct {
	// podDown is when the last of plugd's pods on the node stopped being
	// Ready, or went; zero while one is Ready, and where the caretaker has
	// seen none (plugd outside a pod, or its pods not watched).
	podDown time.Time
	// driverGone is, by CSI driver name, when the kubelet dropped the
	// driver from the node's CSINode; a driver listed, or never seen
	// listed, is absent.
	driverGone map[string]time.Time
}

// mark is a condition look finds unmaintained: its index in the Node's
// conditions, the reason to write, and what showed it, since when.
type mark struct {
	i      int
	reason string
	since  time.Time // the caretaker's clock
	sign   sign      // what the caretaker saw at since
}

// sign is what shows the caretaker that plugd does not maintain a
// condition.
type sign int

const (
	signStale   sign = iota // its heartbeat unchanged
	signPodDown             // plugd's pod not Ready, or gone
	signCSINode             // the driver dropped from CSINode
)

// String names s in the caretaker's log.
func (s sign) String() string {
	return [...]string{"heartbeat", "pod", "CSINode"}[s]
}

// words is s, since at, as a mark's message says it.
func (s sign) words(at time.Time) string {
	f := [...]string{
		"plugd has not maintained this condition since %s by the caretaker's clock",
		"plugd's pod on this node has not been Ready since %s by the caretaker's clock, and plugd has not written this condition since",
		"the kubelet dropped the driver from this node's CSINode at %s by the caretaker's clock, and plugd has not written this condition since",
	}[s]
	return fmt.Sprintf(f, at.UTC().Format(time.RFC3339))
}

// look is what the caretaker does with n at now: the marks of plugd's
// conditions in n.Status.Conditions that nobody maintains, and the
// earliest time another of plugd's can be (zero: none can, nothing to
// look at again).
//
// A condition is unmaintained, first sign first, when
//   - plugd's pod on the node has not been Ready for longer than
//     b.podGrace (ev.podDown) and nobody has written the condition since
//     (PlugdNotRunning);
//   - it is a CSI driver's, says True, the kubelet dropped the driver
//     from CSINode longer than b.csiGrace ago (ev.driverGone) and nobody
//     has written the condition since (PlugdNotRunning);
//   - nobody has changed its heartbeat for longer than b.staleAfter
//     (NotMaintained): the last resort, where plugd runs outside a pod.
//
// "Written since" is a heartbeat seen changing after the sign: a plugd
// that writes is running, whatever its pod says, and is left to the
// heartbeat's bound, so that the caretaker never fights it.
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
func look(n *corev1.Node, now time.Time, b bounds, seen map[string]sighting, ev evidence) (marks []mark, next time.Time) {
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
		m, due := judge(c, s, now, b, ev)
		if m != nil {
			m.i = i
			marks = append(marks, *m)
			continue
		}
		if next.IsZero() || due.Before(next) {
			next = due
		}
	}
	for typ := range seen {
		if !present[typ] {
			delete(seen, typ)
		}
	}
	return marks, next
}

// judge is look's verdict on one of plugd's conditions c, whose heartbeat
// the caretaker saw take its value as s says: its mark (without the
// index), or nil and when it can be due one. Each sign is due the instant
// after its bound: up to the bound inclusive, the condition is
// maintained, as nodecond.Maintained has it.
func judge(c corev1.NodeCondition, s sighting, now time.Time, b bounds, ev evidence) (*mark, time.Time) {
	due := s.at.Add(b.staleAfter + time.Nanosecond)
	var first *mark
	consider := func(reason string, since time.Time, grace time.Duration, sg sign) {
		if first != nil {
			return
		}
		d := since.Add(grace + time.Nanosecond)
		if now.Before(d) {
			if d.Before(due) {
				due = d
			}
			return
		}
		first = &mark{reason: reason, since: since, sign: sg}
	}
	// A heartbeat seen changing after a sign says plugd ran after it.
	if !ev.podDown.IsZero() && !s.at.After(ev.podDown) {
		consider(nodecond.ReasonPlugdNotRunning, ev.podDown, b.podGrace, signPodDown)
	}
	if typ, name, _ := nodecond.Parse(c.Message); b.csiGrace > 0 && typ == api.CSIPlugin && c.Status == corev1.ConditionTrue {
		if gone := ev.driverGone[name]; !gone.IsZero() && !s.at.After(gone) {
			consider(nodecond.ReasonPlugdNotRunning, gone, b.csiGrace, signCSINode)
		}
	}
	consider(nodecond.ReasonNotMaintained, s.at, b.staleAfter, signStale)
	return first, due
}

// unmaintained is what condition c says once the caretaker marks it, at
// now, as m says: Unknown, m's reason, with the plugin it is about still
// in its message (nodecond.Parse), what showed it and what it said
// before; its heartbeat stays the last one plugd wrote.
func unmaintained(c corev1.NodeCondition, m mark, now time.Time) corev1.NodeCondition {
	typ, name, _ := nodecond.Parse(c.Message)
	text := m.sign.words(m.since) +
		fmt.Sprintf(" (it said %s, %s; its last heartbeat, by the node's clock, %s); is plugd running on this node? (marked by plugd's caretaker)",
			c.Status, c.Reason, c.LastHeartbeatTime.UTC().Format(time.RFC3339))
	return corev1.NodeCondition{
		Type: c.Type, Status: corev1.ConditionUnknown, Reason: m.reason,
		Message:           nodecond.Message(typ, name, text),
		LastHeartbeatTime: c.LastHeartbeatTime, LastTransitionTime: metav1.NewTime(now),
	}
}

// markPatch is the JSON patch of n's status that marks the condition m is
// about, and touches nothing else. It first tests that the entry at that
// index is still the one read: the same type, status and heartbeat. A
// heartbeat plugd wrote meanwhile, or a list reordered, fails the patch
// instead of overwriting it. One condition a patch: an admission policy
// that refuses one (its type no longer listed as plugd's) refuses that
// mark alone, not the others with it.
func markPatch(n *corev1.Node, m mark, now time.Time) ([]byte, error) {
	c := n.Status.Conditions[m.i]
	path := fmt.Sprintf("/status/conditions/%d", m.i)
	return json.Marshal([]map[string]any{
		{"op": "test", "path": path + "/type", "value": c.Type},
		{"op": "test", "path": path + "/status", "value": c.Status},
		{"op": "test", "path": path + "/lastHeartbeatTime", "value": c.LastHeartbeatTime},
		{"op": "replace", "path": path, "value": unmaintained(c, m, now)},
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

// podSighting is what the caretaker saw of plugd's pods on one node.
type podSighting struct {
	seen bool      // one was there since the caretaker started
	down time.Time // when the last Ready one stopped being Ready, or went; zero while one is Ready
}

// update is s once the caretaker sees pods, plugd's on the node, at now.
// A node where it never saw one says nothing: plugd may run there outside
// a pod. A pod seen first not Ready (crash-looping when the caretaker
// starts) counts from now.
func (s podSighting) update(pods []*corev1.Pod, now time.Time) podSighting {
	switch {
	case slices.ContainsFunc(pods, podReady):
		return podSighting{seen: true}
	case len(pods) == 0 && !s.seen:
		return s
	case s.down.IsZero():
		return podSighting{seen: true, down: now}
	}
	return s
}

// podReady says p is Ready and not being deleted: plugd in it runs and
// answers its readiness probe. A pod being deleted has had its SIGTERM.
func podReady(p *corev1.Pod) bool {
	if p.DeletionTimestamp != nil {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// updateDrivers records in gone (by driver name: zero while listed, else
// when the caretaker saw it go) that the node's CSINode lists the drivers
// in listed at now. A driver it never saw listed gets no entry: the
// caretaker tells a driver the kubelet dropped, not one it never held
// (plugd in managing mode, with no kubelet writing CSINode).
func updateDrivers(gone map[string]time.Time, listed []string, now time.Time) {
	for name, at := range gone {
		if !slices.Contains(listed, name) && at.IsZero() {
			gone[name] = now
		}
	}
	for _, name := range listed {
		gone[name] = time.Time{}
	}
}

// slimPod keeps of one of plugd's pods what tells whether plugd runs in
// it: its node, its deletion, its Ready condition.
func slimPod(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	out := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, UID: p.UID, ResourceVersion: p.ResourceVersion,
		DeletionTimestamp: p.DeletionTimestamp}, Spec: corev1.PodSpec{NodeName: p.Spec.NodeName}}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			out.Status.Conditions = []corev1.PodCondition{{Type: c.Type, Status: c.Status}}
		}
	}
	return out, nil
}

// slimCSINode keeps of a CSINode its name (the node's) and its drivers'
// names.
func slimCSINode(obj any) (any, error) {
	n, ok := obj.(*storagev1.CSINode)
	if !ok {
		return obj, nil
	}
	out := &storagev1.CSINode{ObjectMeta: metav1.ObjectMeta{Name: n.Name, UID: n.UID, ResourceVersion: n.ResourceVersion}}
	for _, d := range n.Spec.Drivers {
		out.Spec.Drivers = append(out.Spec.Drivers, storagev1.CSINodeDriver{Name: d.Name})
	}
	return out, nil
}
