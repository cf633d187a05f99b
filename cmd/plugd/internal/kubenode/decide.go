package kubenode

import (
	"fmt"
	"maps"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/plugd/plugd/api"
	"github.com/plugd/plugd/cmd/plugd/internal/kubenode/kubeletstate"
	"github.com/plugd/plugd/internal/nodecond"
)

// facts are what one evaluation gathered (gather): plain values, read
// once.
type facts struct {
	now time.Time
	// socks are the manager's plugins by (type, name), each expected one
	// there; unasked says a socket may be an expected plugin's that has
	// not said who it is (sockets).
	socks   map[key][]Socket
	unasked bool
	// node is the Node as the informer has it (nil: none); readable says
	// it was read soundly: nothing is written otherwise. seq counts the
	// Node updates delivered before it was read.
	node     *corev1.Node
	readable bool
	seq      uint64
	// kubelet is what the kubelet's evidence says of the sockets, and
	// evidence that evidence itself.
	kubelet  kubeletFacts
	evidence kubeletstate.Evidence
	// views are the kubelet views of the plugins; stale (and more of
	// them) the CSINode entries the running kubelet does not hold.
	views map[key]view
	stale []staleEntry
	more  int
	// localChanges counts the Changed calls: the plugins changed.
	localChanges uint64
	// jitter, in [0, 1), spreads the delay of a write back after
	// overwrites: drawn by gather, so that decide draws nothing.
	jitter float64
}

// policy is the configuration decide reads.
type policy struct {
	expect      []Expectation
	registryDir string
	heartbeat   time.Duration // 0: none
	grace       time.Duration
	taints      []taintRule
	window      time.Duration // the taints' startup window
	nodeName    string
	// republishGrace is how long a DRA driver's True condition outlasts an
	// incomplete pool (republished).
	republishGrace time.Duration
}

// memory is what the loop keeps from one decision to the next, a plain
// value: decide returns the next one in its plan, and act stores it, with
// what its writes did.
type memory struct {
	written map[string]written // conditions written, not yet seen back, by type
	// held are verdicts that keep their condition's status, waiting out
	// coalesce before they are written, by condition type.
	held     map[string]*heldVerdict
	disagree map[disagreementKey]*disagreement
	// fights are, by condition type, the overwrites of plugd's conditions
	// by another writer (overwritten).
	fights map[string]*fight
	// registered are the sockets the kubelet has registered, with the
	// socket's creation time, for the latency metrics.
	registered map[string]time.Time
	// unsettledSince is when the kubelet and the sockets began to
	// disagree (zero: they agree); localChanges the Changed calls seen.
	unsettledSince time.Time
	localChanges   uint64
	// removed says extra condition entries were removed when removedSeq
	// Node updates had arrived: until another arrives, the cache still
	// shows them.
	removed    bool
	removedSeq uint64
	// lastBeat is when the conditions were last written for a heartbeat.
	lastBeat time.Time
	// notInCSINode is, by condition type, since when the kubelet has held
	// a CSI driver's socket that CSINode does not list.
	notInCSINode map[string]time.Time
	// taints is what plugd remembers of each taint it manages, by
	// KEY:EFFECT (taints.go).
	taints   map[string]taintMemory
	taintsOf types.UID // the Node taints is of
	// republish is, by condition type, since when a DRA driver whose
	// condition is True has had an incomplete pool (republished).
	republish map[string]time.Time
	// switching is, by condition type, since when an anyOf condition the
	// Node shows True has had no ready alternative (anyof.go).
	switching map[string]time.Time
}

func newMemory() memory {
	return memory{written: map[string]written{}, held: map[string]*heldVerdict{}, disagree: map[disagreementKey]*disagreement{},
		fights: map[string]*fight{}, registered: map[string]time.Time{}, notInCSINode: map[string]time.Time{}, taints: map[string]taintMemory{},
		republish: map[string]time.Time{}, switching: map[string]time.Time{}}
}

// clone is a copy of m that shares nothing with it.
func (m memory) clone() memory {
	c := m
	c.written, c.registered, c.notInCSINode = maps.Clone(m.written), maps.Clone(m.registered), maps.Clone(m.notInCSINode)
	c.republish = maps.Clone(m.republish)
	c.held, c.disagree = cloneEach(m.held), cloneEach(m.disagree)
	c.fights, c.taints = cloneEach(m.fights), maps.Clone(m.taints)
	c.switching = maps.Clone(m.switching)
	for _, f := range c.fights {
		f.pending = slices.Clone(f.pending)
	}
	return c
}

func cloneEach[K comparable, V any](m map[K]*V) map[K]*V {
	out := make(map[K]*V, len(m))
	for k, v := range m {
		c := *v
		out[k] = &c
	}
	return out
}

// written is a condition plugd wrote, and how many Node updates had arrived
// then: until another arrives, the cache does not show it yet.
type written struct {
	v   conditionVerdict
	seq uint64
	c   corev1.NodeCondition // as written; no Type for a deletion
}

// heldVerdict is a verdict waiting to be written: first is when the
// condition first differed, since when it became v.
type heldVerdict struct {
	v            conditionVerdict
	first, since time.Time
}

// plan is what one evaluation decided: the conditions to set and the types
// to drop, extra entries to remove and the taint's removal, the events to
// tell (now, or once the conditions are written), the lines to log and
// the metrics to count, each expectation's state for the status API, the
// reads of the kubelet to ask for, when to look again, and the memory to
// keep.
type plan struct {
	set    []corev1.NodeCondition
	drop   []string
	extra  []conditionEntry
	taints []taintChange // taints to remove or put back
	notes  []event
	tell   []event
	logs   []logLine
	// observed are the latencies to observe, overwrites the conditions
	// found overwritten (a count each).
	observed   []observation
	overwrites []string
	states     []ConditionState
	ready      map[string]bool // by condition type, where plugd can tell
	allReady   bool
	beat       bool // a heartbeat: the conditions that hold are written again
	// wantMetrics and wantDevices are the next reads of the kubelet
	// wished for (zero: none).
	wantMetrics, wantDevices time.Time
	next                     time.Time
	mem                      memory
}

// logLine is a line decide asks act to log.
type logLine struct {
	warn bool
	msg  string
	args []any
}

// observation is a latency to observe in the histogram of its kind, by
// plugin type.
type observation struct {
	kind    observed
	typ     string
	seconds float64
}

type observed int

const (
	observedRegistration observed = iota // plugd_kubelet_registration_seconds
	observedAfterStart                   // plugd_kubelet_registration_after_start_seconds
	observedNotReady                     // plugd_expected_plugin_not_ready_seconds
)

// decision is decide at work: the facts, the memory it changes (its own
// copy), and the plan it fills.
type decision struct {
	pol policy
	f   facts
	m   memory
	p   plan
}

// decide is what plugd does about facts f, given the memory of the
// decisions before: a pure function (no sockets, no API, no clock, and
// mem is left as it is). While the Node cannot be read, the verdicts are
// still made (for the status API and the doctor), and nothing is written.
func decide(pol policy, f facts, mem memory) plan {
	d := &decision{pol: pol, f: f, m: mem.clone(), p: plan{ready: map[string]bool{}}}
	d.observeRegistrations()
	next := d.disagreements()
	next = earliest(next, d.paceKubelet())
	if f.readable {
		d.cleanUp()
	}
	beatDue := d.beatDue()
	d.p.beat = !beatDue.IsZero() && !f.now.Before(beatDue)
	next = earliest(next, d.judgeAll())
	if f.readable {
		next = d.finish(beatDue, next)
	}
	d.p.next, d.p.mem = next, d.m
	return d.p
}

// cleanUp drops the conditions of plugins no longer expected, and the
// Node's extra entries of plugd's, unless plugd did so already and the
// informer has not brought that back.
func (d *decision) cleanUp() {
	for _, typ := range unexpected(d.f.node, d.pol.expect) {
		if w, ok := d.m.written[typ]; !ok || w.seq != d.f.seq {
			d.p.drop = append(d.p.drop, typ)
		}
	}
	if !d.m.removed || d.m.removedSeq != d.f.seq {
		d.p.extra = extras(d.f.node, d.pol.expect)
	}
}

// finish decides the heartbeat's and the taints' part: a heartbeat with
// nothing plugd can vouch for puts the next one a heartbeat away; the
// taints go as their plugins are ready (decideTaints).
func (d *decision) finish(beatDue, next time.Time) time.Time {
	p := &d.p
	if p.beat && len(p.set) == 0 {
		d.m.lastBeat = d.f.now
	}
	if !beatDue.IsZero() {
		next = earliest(next, beatDue)
	}
	d.decideTaints()
	return next
}

// decideTaints decides about every taint plugd manages, from the
// conditions as this decision judged them. A change's memory is kept once
// it is written (taintChange.after); the rest now.
func (d *decision) decideTaints() {
	if len(d.pol.taints) == 0 || d.f.node == nil {
		return
	}
	conds := map[string]condNow{}
	for _, e := range d.pol.expect {
		ready, judged := d.p.ready[e.Condition]
		if !judged {
			continue // Unknown: nothing is decided on it
		}
		c := condNow{status: corev1.ConditionFalse, since: d.f.now}
		if ready {
			c.status = corev1.ConditionTrue
		}
		if cur := findCondition(d.f.node, e.Condition); cur != nil && cur.Status == c.status {
			c.since = cur.LastTransitionTime.Time
		}
		conds[e.Condition] = c
	}
	f := taintFacts{now: d.f.now, window: d.pol.window, taints: d.f.node.Spec.Taints, owner: taintsOwner(d.f.node), conds: conds}
	if r := d.f.evidence.Reading; r != nil {
		f.kubeletBoot = r.Started // unknown while the kubelet cannot be read: a re-add is then left
	}
	if d.f.node.UID != d.m.taintsOf {
		// Another Node (deleted and created again, by the kubelet with its
		// registration taints): what plugd did to the last one is no
		// memory of this one's.
		d.m.taints, d.m.taintsOf = map[string]taintMemory{}, d.f.node.UID
	}
	changes, next := decideTaints(d.pol.taints, f, d.m.taints)
	for i := range changes {
		id := changes[i].rule.String()
		changes[i].after, next[id] = next[id], d.m.taints[id]
		changes[i].registered = d.registeredAt(changes[i])
	}
	for _, r := range d.pol.taints {
		if h := next[r.String()].left; h != nil && d.m.taints[r.String()].left == nil {
			d.p.logs = append(d.p.logs, logLine{warn: true, msg: "a startup taint put back by another writer is left to it: past the startup window, or removed again too often",
				args: []any{"taint", r.String(), "writer", h.manager, "since", h.since}})
		}
	}
	d.p.taints, d.m.taints = changes, next
}

// judgeAll judges each expected plugin's condition against the Node's
// and fills the plan; it returns when to look again for a change it holds
// back.
func (d *decision) judgeAll() time.Time {
	var next time.Time
	d.p.allReady = true
	for _, e := range d.pol.expect {
		next = earliest(next, d.judgeOne(e))
	}
	return next
}

// judgeOne judges expected plugin e's condition.
func (d *decision) judgeOne(e Expectation) time.Time {
	f, p, now := d.f, &d.p, d.f.now
	k := key{e.Type, e.Name}
	cur := findCondition(f.node, e.Condition)
	st := ConditionState{Expectation: e}
	if cur != nil {
		c := *cur
		st.Actual = &c
	}
	v, ok, wait := d.judgeExpectation(e, cur)
	if !ok && wait.IsZero() {
		v, ok, wait = d.notInCSINode(e.Condition, f.views[k])
	} else if ok {
		delete(d.m.notInCSINode, e.Condition)
	}
	if !ok {
		p.allReady = false
		delete(d.m.held, e.Condition)
		p.states = append(p.states, st)
		return wait
	}
	if e.Type == TypeDRA {
		v, wait = d.republished(e.Condition, v, cur)
	}
	st.Want = &corev1.NodeCondition{Type: corev1.NodeConditionType(e.Condition), Status: v.status, Reason: v.reason, Message: v.message}
	if due, held := d.switching(e, v, cur); held {
		p.ready[e.Condition], st.Pending = true, true // True on the Node while another may take over
		p.states = append(p.states, st)
		return due
	}
	p.ready[e.Condition] = v.status == corev1.ConditionTrue
	p.allReady = p.allReady && v.status == corev1.ConditionTrue
	if sameVerdict(cur, v) {
		delete(d.m.written, e.Condition)
		delete(d.m.held, e.Condition)
		d.confirmed(e.Condition, v)
		if p.beat {
			p.set = append(p.set, nodeCondition(e.Condition, v, cur, now))
		}
		p.states = append(p.states, st)
		return wait
	}
	st.Pending = true
	p.states = append(p.states, st)
	if !f.readable {
		return time.Time{}
	}
	var already bool
	if cur, already = d.m.asWritten(e.Condition, v, cur, f.seq); already {
		return time.Time{} // written; the informer has not brought it back yet
	}
	if due := d.writeDue(e, k, v, cur); now.Before(due) {
		return due
	}
	p.set = append(p.set, nodeCondition(e.Condition, v, cur, now))
	d.transition(e, k, v, cur)
	return time.Time{}
}

// notInCSINode judges a CSI driver whose socket the kubelet holds while
// CSINode does not list it (judge waits on that): the kubelet writes the
// entry as it registers, so past csiNodeWait its registration failed, and
// the condition says False. Otherwise nothing is concluded; wait is when
// to judge again.
func (d *decision) notInCSINode(cond string, v view) (_ conditionVerdict, ok bool, wait time.Time) {
	return d.notInCSINodeOf(d.expectation(cond), cond, v)
}

// notInCSINodeOf is notInCSINode for the plugin of e, remembered as id.
func (d *decision) notInCSINodeOf(e Expectation, cond string, v view) (_ conditionVerdict, ok bool, wait time.Time) {
	if v.State != api.KubeletRegistered || v.Reason != "NotInCSINode" {
		delete(d.m.notInCSINode, cond)
		return conditionVerdict{}, false, time.Time{}
	}
	since, seen := d.m.notInCSINode[cond]
	if !seen {
		since = d.f.now
		d.m.notInCSINode[cond] = since
	}
	if d.f.now.Before(since.Add(csiNodeWait)) {
		return conditionVerdict{}, false, since.Add(csiNodeWait)
	}
	return conditionVerdict{corev1.ConditionFalse, "NotInCSINode", nodecond.Message(e.Type, e.Name,
		fmt.Sprintf("the kubelet holds its socket, but its CSINode has not listed the driver for %s: its registration failed (a kubelet before v1.36 keeps such a socket and never retries it: restart the plugin's pod)", csiNodeWait))}, true, time.Time{}
}

// republished keeps a DRA driver's True condition as it is while a pool
// is incomplete (PoolIncomplete), for republishGrace from when it was
// first seen so: a driver that republishes (the generation moves) writes
// its slices one by one, and the condition does not flap while the new
// generation completes. A pool that stays incomplete turns it False once
// the grace is over; a condition that is not True is not held (a first
// publish is not ready until it is complete). wait is when the grace
// ends, zero if v stands.
func (d *decision) republished(cond string, v conditionVerdict, cur *corev1.NodeCondition) (_ conditionVerdict, wait time.Time) {
	if v.reason != ReasonPoolIncomplete || cur == nil || cur.Status != corev1.ConditionTrue {
		delete(d.m.republish, cond)
		return v, time.Time{}
	}
	since, seen := d.m.republish[cond]
	if !seen {
		since = d.f.now
		d.m.republish[cond] = since
	}
	if end := since.Add(d.pol.republishGrace); d.f.now.Before(end) {
		return conditionVerdict{cur.Status, cur.Reason, cur.Message}, end
	}
	return v, time.Time{}
}

// expectation is the expected plugin of condition type cond.
func (d *decision) expectation(cond string) Expectation {
	for _, e := range d.pol.expect {
		if e.Condition == cond {
			return e
		}
	}
	return Expectation{}
}

// transition tells, once the write is made, of a condition turning True
// (and how long it was not) or turning from True.
func (d *decision) transition(e Expectation, k key, v conditionVerdict, cur *corev1.NodeCondition) {
	p := &d.p
	switch {
	case v.status == corev1.ConditionTrue && (cur == nil || cur.Status != corev1.ConditionTrue):
		cause := ""
		if v.reason != ReasonReady {
			cause = v.reason
		}
		p.notes = append(p.notes, event{corev1.EventTypeNormal, "PluginReady", k, cause, v.message, ""})
		if cur != nil {
			p.observed = append(p.observed, observation{observedNotReady, e.Type, d.f.now.Sub(cur.LastTransitionTime.Time).Seconds()})
		}
	case v.status != corev1.ConditionTrue && cur != nil && cur.Status == corev1.ConditionTrue:
		p.notes = append(p.notes, event{corev1.EventTypeWarning, "PluginNotReady", k, v.reason, v.message + " (" + v.reason + ")", ""})
	}
}

// hold keeps v, which changes only the reason or message of condition
// typ, and returns when it is due to be written.
func (d *decision) hold(typ string, v conditionVerdict) time.Time {
	h := d.m.held[typ]
	switch {
	case h == nil:
		h = &heldVerdict{v: v, first: d.f.now, since: d.f.now}
		d.m.held[typ] = h
	case h.v != v:
		h.v, h.since = v, d.f.now
	}
	return earliest(h.since.Add(coalesce), h.first.Add(maxCoalesce))
}

// asWritten is the condition cond to judge verdict v against: the Node's,
// cur, unless plugd wrote cond since the Node updates seq the informer has
// delivered. Then the Node holds plugd's write, which the informer has not
// brought back (its watch can lag seconds behind an API server that came
// back): already says it is v; otherwise v is judged against that
// write, so that a new reason is held as any is and a transition is told
// once.
func (m memory) asWritten(cond string, v conditionVerdict, cur *corev1.NodeCondition, seq uint64) (_ *corev1.NodeCondition, already bool) {
	w, ok := m.written[cond]
	if !ok || w.seq != seq || w.c.Type == "" {
		return cur, false
	}
	if w.v == v {
		return cur, true
	}
	c := w.c
	return &c, false
}

// writeDue says when plugd may write its verdict v of e's condition, which
// the Node shows as cur: not before another writer's overwrites have been
// waited out (overwritten), nor, where only the reason or message changed,
// before the change has held for a moment (hold).
func (d *decision) writeDue(e Expectation, k key, v conditionVerdict, cur *corev1.NodeCondition) time.Time {
	if due := d.overwritten(e, k, v, cur); d.f.now.Before(due) {
		return due
	}
	if cur != nil && cur.Status == v.status && !holderChanged(cur, v) {
		if due := d.hold(e.Condition, v); d.f.now.Before(due) {
			return due
		}
	}
	delete(d.m.held, e.Condition)
	return time.Time{}
}

// beatDue is when plugd's conditions are due a heartbeat: heartbeat after
// the oldest of them was last written (zero: never).
func (d *decision) beatDue() time.Time {
	if d.pol.heartbeat <= 0 {
		return time.Time{}
	}
	var oldest time.Time
	for _, e := range d.pol.expect {
		if c := findCondition(d.f.node, e.Condition); c != nil && (oldest.IsZero() || c.LastHeartbeatTime.Time.Before(oldest)) {
			oldest = c.LastHeartbeatTime.Time
		}
	}
	if oldest.IsZero() {
		return time.Time{}
	}
	// The informer may not have brought the last write back yet.
	return latest(oldest, d.m.lastBeat).Add(d.pol.heartbeat)
}

// observeRegistrations counts, once per socket, the time from its
// appearance (and from the kubelet's start, when it was there before) to
// the running kubelet having registered it, as the reads show it.
func (d *decision) observeRegistrations() {
	kf, ev := d.f.kubelet, d.f.evidence
	if !kf.live || ev.Reading == nil {
		return
	}
	present := map[string]bool{}
	for k, ps := range d.f.socks {
		for _, p := range ps {
			present[p.Path] = true
			if !kf.registered[p.Path] || p.Created.IsZero() {
				continue
			}
			if c, ok := d.m.registered[p.Path]; ok && c.Equal(p.Created) {
				continue
			}
			d.m.registered[p.Path] = p.Created
			since := ev.PresentSince(p.Path)
			if since.IsZero() {
				since = ev.Reading.At
			}
			if dt := since.Sub(p.Created); dt >= 0 && dt < time.Hour {
				d.p.observed = append(d.p.observed, observation{observedRegistration, k.typ, dt.Seconds()})
			}
			if p.Created.Before(ev.Reading.Started) {
				if dt := since.Sub(ev.Reading.Started); dt >= 0 && dt < time.Hour {
					d.p.observed = append(d.p.observed, observation{observedAfterStart, k.typ, dt.Seconds()})
				}
			}
		}
	}
	for s := range d.m.registered {
		if !present[s] {
			delete(d.m.registered, s)
		}
	}
}

// paceKubelet wishes for the reads of the kubelet the sockets need: while
// the kubelet and the sockets disagree, often for a while after the
// disagreement began (or the plugins last changed); while an expected
// device plugin waits for healthy devices, pod-resources every second. It
// returns when to look again, to slow the reads down.
func (d *decision) paceKubelet() time.Time {
	f, now := d.f, d.f.now
	unsettled := false
	if f.kubelet.live {
		for k, v := range f.views {
			answering := slices.ContainsFunc(f.socks[k], func(p Socket) bool { return p.Answering })
			if answering != (v.State == api.KubeletRegistered) && k.typ != "" && v.Reason != "UnsupportedType" {
				unsettled = true
				break
			}
		}
	}
	switch {
	case !unsettled:
		d.m.unsettledSince = time.Time{}
	case d.m.unsettledSince.IsZero() || f.localChanges != d.m.localChanges:
		d.m.unsettledSince = now
	}
	d.m.localChanges = f.localChanges
	reading := f.evidence.Reading
	since := d.m.unsettledSince
	if !since.IsZero() && reading != nil {
		switch dt := now.Sub(since); {
		case dt < fastFor:
			d.p.wantMetrics = reading.At.Add(unsettledFast)
		case dt < slowFor:
			d.p.wantMetrics = reading.At.Add(unsettledSlow)
		}
	}
	if f.kubelet.reregistering && reading != nil {
		d.p.wantMetrics = earliest(d.p.wantMetrics, reading.At.Add(unsettledFast))
	}
	if f.kubelet.live && reading != nil {
		for _, e := range expectedPlugins(d.pol.expect) {
			v := f.views[key{e.Type, e.Name}]
			if e.Type == TypeDevice && v.State == api.KubeletRegistered && v.healthy < e.MinHealthyDevices {
				// A poll from the last read of the devices: the last read
				// of the metrics is up to a resync old, and a wish from it
				// is in the past at once, every time (issue 33, item 4).
				d.p.wantDevices = latest(reading.At, f.evidence.DevicesAt).Add(devicesPoll)
			}
		}
	}
	if !since.IsZero() {
		// Look again when fast reads end, to slow them down.
		switch dt := now.Sub(since); {
		case dt < fastFor:
			return since.Add(fastFor)
		case dt < slowFor:
			return since.Add(slowFor)
		}
	}
	return time.Time{}
}

// The kinds of disagreement between the kubelet and the sockets, the
// causes of KubeletDisagrees events.
const (
	causeNotTakenUp = "NotRegistered"     // a socket answers; the kubelet has not registered it
	causeDeadHeld   = "SocketNotServed"   // the kubelet has it; no socket of it answers
	causeStaleEntry = "StaleCSINodeEntry" // CSINode lists a driver the running kubelet does not hold
)

// disagreement is a plugin whose socket and kubelet view disagree, for one
// cause.
type disagreement struct {
	since    time.Time
	reported bool
}

type disagreementKey struct {
	plugin key
	cause  string
}

// disagreements tells of each plugin whose socket and kubelet view have
// disagreed for the grace period, once per disagreement, and returns when
// the next one is due. A view that cannot be read (the API or the kubelet
// unreachable) neither starts nor ends a disagreement: one that outlasts
// an outage is still the one it was, and is not told again. The stale
// CSINode entries are known only while the kubelet is read.
func (d *decision) disagreements() time.Time {
	now, live := d.f.now, d.f.kubelet.live
	current, unknown := disagreementsOf(d.f.socks, d.f.views, live)
	for _, e := range d.f.stale {
		current[disagreementKey{key{TypeCSI, e.driver}, causeStaleEntry}] = e.message
	}
	var next time.Time
	for dk, text := range current {
		g := d.m.disagree[dk]
		if g == nil {
			g = &disagreement{since: now}
			d.m.disagree[dk] = g
		}
		switch due := g.since.Add(d.pol.grace); {
		case g.reported:
		case !now.Before(due):
			g.reported = true
			d.p.tell = append(d.p.tell, event{corev1.EventTypeWarning, "KubeletDisagrees", dk.plugin, dk.cause,
				fmt.Sprintf("%s: for %s, %s", dk.plugin, now.Sub(g.since).Round(time.Second), text), ""})
		default:
			next = earliest(next, due)
		}
	}
	for dk := range d.m.disagree {
		if _, ok := current[dk]; !ok && !unknown[dk.plugin] && (live || dk.cause != causeStaleEntry) {
			delete(d.m.disagree, dk)
		}
	}
	return next
}

// disagreementsOf are the plugins whose socket and kubelet view disagree
// now, with what the event would say; unknown those whose view cannot
// be read.
func disagreementsOf(socks map[key][]Socket, views map[key]view, kubeletLive bool) (map[disagreementKey]string, map[key]bool) {
	current := map[disagreementKey]string{}
	unknown := map[key]bool{}
	for k, v := range views {
		if k.typ != TypeCSI && k.typ != TypeDevice && k.typ != TypeDRA {
			continue
		}
		if v.State == api.KubeletUnknown && slices.Contains(apiReasons, v.Reason) {
			unknown[k] = true
			continue
		}
		answering := slices.ContainsFunc(socks[k], func(p Socket) bool { return p.Answering })
		switch {
		case answering && v.State == api.KubeletNotRegistered:
			current[disagreementKey{k, causeNotTakenUp}] = "its socket answers, but the kubelet has not registered it: " + v.Message
		case !answering && v.State == api.KubeletRegistered && !(k.typ == TypeDevice && !v.healthyFresh && v.healthy == 0):
			// A device plugin that went keeps its capacity for the
			// kubelet's grace period, with nothing allocatable: the
			// kubelet has let it go, and agrees.
			has := "the kubelet has it (" + v.Message + ")"
			if k.typ == TypeDRA && !kubeletLive {
				has = v.Message // the evidence is the driver's slices: say so, and no more
			}
			current[disagreementKey{k, causeDeadHeld}] = has + ", but no socket of it answers"
		}
	}
	return current, unknown
}

// Overwrites. A condition plugd wrote (or saw on the Node as it would
// write it), then finds changed by another writer while plugd's verdict is
// the same, was overwritten: a caretaker that judges plugd's heartbeat on
// a clock skewed from the node's, an operator's script, a second plugd.
// Writing it back at once, every time, is a fight that neither side wins
// (two PATCHes a second, the condition flipping, in issue 33). After
// fightUndos overwrites within fightWindow, plugd writes it back only
// after a delay doubling from fightDelayMin to fightDelayMax (timing.go),
// and says so once (a warning in its log, a Warning event
// ConditionOverwritten on the Node); every overwrite counts in
// plugd_node_condition_overwritten_total. A condition left as plugd wrote
// it for fightWindow ends the fight.

// fight is what plugd knows of the overwrites of one condition.
type fight struct {
	seen    conditionVerdict // plugd's verdict, as last seen on the Node
	shown   bool             // the Node shows seen now
	shownAt time.Time        // since when
	// mine is the verdict plugd stands by on the Node: the last it wrote
	// or saw there. Only a change of it by another counts.
	mine conditionVerdict
	// pending are the verdicts plugd wrote since the Node last showed the
	// latest of them: a Node that shows one of them shows plugd's own
	// write, come back late, not another writer's.
	pending []conditionVerdict
	// answered says plugd wrote its verdict back (or saw it back) since
	// the last overwrite it counted: the next is another overwrite, seen
	// or not the write back.
	answered bool
	undos    int // overwrites since first
	first    time.Time
	// step is the next delay before it is spread (zero: fightDelayMin);
	// due is when the write back may be made.
	step time.Duration
	due  time.Time
}

// maxPending bounds fight.pending: a verdict that flips faster than the
// informer echoes it has a write or two in flight, not more.
const maxPending = 4

// delay is the next delay of the write back, step spread by writeJitter
// with u in [0, 1); step doubles up to fightDelayMax.
func (f *fight) delay(u float64) time.Duration {
	if f.step == 0 {
		f.step = fightDelayMin
	}
	d := time.Duration(float64(f.step) * (1 - writeJitter + 2*writeJitter*u))
	f.step = min(2*f.step, fightDelayMax)
	return min(d, fightDelayMax)
}

// fightOf is the record of the overwrites of cond, made if need be.
func (m memory) fightOf(cond string) *fight {
	f := m.fights[cond]
	if f == nil {
		f = &fight{answered: true}
		m.fights[cond] = f
	}
	return f
}

// confirmed notes that the Node shows plugd's verdict v for cond now.
func (d *decision) confirmed(cond string, v conditionVerdict) {
	now := d.f.now
	f := d.m.fightOf(cond)
	if !f.shown || f.seen != v {
		f.seen, f.shown, f.shownAt = v, true, now
	}
	f.mine, f.answered = v, true
	if len(f.pending) > 0 && f.pending[len(f.pending)-1] == v {
		f.pending = nil // the latest write is back: the others are past
	}
	if f.undos > 0 && now.Sub(f.shownAt) >= fightWindow {
		if f.undos >= fightUndos {
			d.p.logs = append(d.p.logs, logLine{msg: "Node condition: no longer overwritten", args: []any{"node", d.pol.nodeName, "condition", cond}})
		}
		d.m.fights[cond] = &fight{seen: v, shown: true, shownAt: now, mine: v, answered: true}
	}
}

// wrote notes that plugd wrote its verdict v for cond: the write back of
// an overwrite, or a change of its own.
func (m memory) wrote(cond string, v conditionVerdict) {
	f := m.fightOf(cond)
	f.mine, f.answered = v, true
	if len(f.pending) == 0 || f.pending[len(f.pending)-1] != v {
		if len(f.pending) == maxPending {
			f.pending = f.pending[1:]
		}
		f.pending = append(f.pending, v)
	}
}

// overwritten says when plugd may write its verdict v of e's condition
// again, now that the Node shows cur instead: at once, unless another
// writer has overwritten it (above) fightUndos times within fightWindow.
// An overwrite is counted once plugd has written its verdict back, not
// once it has seen that write on the Node: another writer quicker than
// plugd's informer is still counted. A Node that shows a verdict plugd
// wrote itself (a quick flip, echoed late) is no overwrite.
func (d *decision) overwritten(e Expectation, k key, v conditionVerdict, cur *corev1.NodeCondition) time.Time {
	now := d.f.now
	f := d.m.fights[e.Condition]
	switch {
	case f == nil:
		return time.Time{}
	case f.mine != v:
		return time.Time{} // not an overwrite: plugd's verdict changed
	case cur != nil && slices.ContainsFunc(f.pending, func(p conditionVerdict) bool { return sameVerdict(cur, p) }):
		return time.Time{} // plugd's own write, come back late
	case !f.answered:
		return f.due // this overwrite is counted: wait out its delay
	}
	f.shown, f.answered = false, false
	d.p.overwrites = append(d.p.overwrites, e.Condition)
	if f.undos == 0 || now.Sub(f.first) > fightWindow {
		f.undos, f.first = 0, now
	}
	f.undos++
	if f.undos < fightUndos {
		f.due = time.Time{}
		return f.due
	}
	f.due = now.Add(f.delay(d.f.jitter))
	if f.undos == fightUndos {
		was := "it is gone"
		if cur != nil {
			was = fmt.Sprintf("it says %s, %s: %s", cur.Status, cur.Reason, cur.Message)
		}
		msg := fmt.Sprintf("another writer overwrote plugd's condition %s %d times within %s (%s); plugd writes it back after a delay, from %s up to %s, instead of at once: is plugd's caretaker older than this plugd, or does another program write this condition?",
			e.Condition, f.undos, fightWindow, was, fightDelayMin, fightDelayMax)
		d.p.logs = append(d.p.logs, logLine{warn: true, msg: "Node condition overwritten again and again: backing off", args: []any{"node", d.pol.nodeName, "condition", e.Condition, "detail", msg}})
		d.p.tell = append(d.p.tell, event{corev1.EventTypeWarning, "ConditionOverwritten", k, "", msg, ""})
	}
	return f.due
}
