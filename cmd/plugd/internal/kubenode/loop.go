package kubenode

import (
	"context"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"

	"github.com/plugd/plugd/api"
	"github.com/plugd/plugd/cmd/plugd/internal/kubenode/kubeletstate"
	"github.com/plugd/plugd/internal/backoff"
	"github.com/plugd/plugd/internal/nodecond"
)

// Run reads the API server and the kubelet, and keeps the conditions,
// until ctx is done. It returns nil then, once everything it started has
// stopped. It never fails for the API server's or the kubelet's sake:
// trouble is logged, counted, shown as the plugins' kubelet view and by
// Problems, and retried.
func (n *Node) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	for _, s := range []*source{n.node, n.csiNode, n.slices} {
		wg.Go(func() { s.inf.RunWithContext(ctx) })
	}
	wg.Go(func() { n.kubelet.Run(ctx) })
	bc := events.NewBroadcaster(eventSink{n, &events.EventSinkImpl{Interface: n.events}})
	defer bc.Shutdown()
	if err := bc.StartRecordingToSinkWithContext(ctx); err != nil {
		n.log.Warn("Kubernetes events will not be recorded", "err", err)
	}
	l := newLoop(n, bc.NewRecorder(n.scheme, "plugd"))
	n.log.Info("Kubernetes: watching this node's objects", "node", n.cfg.NodeName, "expected", len(n.cfg.Expect), "kubelet", n.cfg.Kubelet.Address)

	timer := n.clock.NewTimer(0)
	defer timer.Stop()
	var last time.Time
	for {
		select {
		case <-ctx.Done():
			cancel()
			wg.Wait()
			return nil
		case <-n.kick:
			if gap := n.clock.Since(last); gap < minEvalGap {
				timer.Reset(minEvalGap - gap)
				continue
			}
		case <-timer.C():
		}
		now := n.clock.Now()
		last = now
		next := l.evaluate(ctx, now)
		wait := localResync
		if !next.IsZero() {
			wait = min(wait, max(next.Sub(now), minEvalGap))
		}
		timer.Reset(wait)
	}
}

// loop is Run's state between evaluations; only Run's goroutine uses it.
type loop struct {
	n        *Node
	rec      events.EventRecorder
	written  map[string]written // conditions written, not yet seen back, by type
	disagree map[disagreementKey]*disagreement
	// held are verdicts that keep their condition's status, waiting out
	// coalesce before they are written, by condition type.
	held map[string]*heldVerdict
	// mem is what each CSI driver last said of itself.
	mem map[key]remembered
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
	// cache is the last views and what they were made of.
	cache viewCache

	// fights are, by condition type, the overwrites of plugd's conditions
	// by another writer (overwritten).
	fights map[string]*fight

	// writeDelay is the backoff of writes after a failure, reset by a
	// success; nextWrite is when the next may be made.
	writeDelay backoff.Backoff
	nextWrite  time.Time
}

func newLoop(n *Node, rec events.EventRecorder) *loop {
	return &loop{n: n, rec: rec, written: map[string]written{}, disagree: map[disagreementKey]*disagreement{},
		held: map[string]*heldVerdict{}, mem: map[key]remembered{}, registered: map[string]time.Time{}, fights: map[string]*fight{},
		writeDelay: backoff.New(writeBackoffMin, writeBackoffMax, writeJitter)}
}

// written is a condition plugd wrote, and how many Node updates had arrived
// then: until another arrives, the cache does not show it yet.
type written struct {
	v   verdict
	seq uint64
	c   corev1.NodeCondition // as written; no Type for a deletion
}

// heldVerdict is a verdict waiting to be written: first is when the
// condition first differed, since when it became v.
type heldVerdict struct {
	v            verdict
	first, since time.Time
}

// evaluate compares the plugins with the kubelet's and the API's view,
// publishes the kubelet views, and writes what changed. It returns when it
// wants to run again (zero: no need before the next change).
func (l *loop) evaluate(ctx context.Context, now time.Time) time.Time {
	n := l.n
	socks, unasked := l.sockets()
	l.remember(socks)
	// seq is the Node updates delivered before the snapshot: one delivered
	// while it is read may be in it or not, and counts as not yet seen.
	snap := n.snapshot()
	seq := snap.seq[0]
	kn := n.kubeletEvidence()
	kf := kubeletFactsOf(kn, n.cfg.Kubelet.Address, socks)
	n.setMetricMissing(kf)
	views, stale, more := l.views(socks, snap, kf, kn)
	n.publish(views, now)
	l.observeRegistrations(socks, kf, kn)
	n.setStale(stale, more)

	next := l.disagreements(now, socks, views, stale, kf.live, snap.node)
	next = earliest(next, l.paceKubelet(now, socks, views, kf, kn))
	// While the Node cannot be read, the verdicts are still held against
	// the last Node read (for the doctor), and nothing is written.
	readable := snap.nodeProblem == nil && snap.node != nil
	var p plan
	if readable {
		for _, typ := range unexpected(snap.node, n.cfg.Expect) {
			if w, ok := l.written[typ]; !ok || w.seq != seq {
				p.drop = append(p.drop, typ) // not already deleted and not yet seen so
			}
		}
	}
	if readable && (!l.removed || l.removedSeq != seq) {
		p.extra = extras(snap.node, n.cfg.Expect) // not already removed and not yet seen so
	}
	beatDue := l.beatDue(snap.node)
	p.beat = !beatDue.IsZero() && !now.Before(beatDue)
	next = earliest(next, l.judgeAll(now, snap.node, socks, unasked, views, readable, seq, &p))
	n.setConditions(p.states)
	if !readable {
		return next
	}
	return l.act(ctx, now, snap.node, p, beatDue, next)
}

// sockets are the manager's plugins by their (type, name), each expected
// one there (nil without a socket). unasked: the directory not walked yet,
// or a socket found whose plugin has not said who it is. Any expected
// plugin without a socket may be behind it, so none is called missing
// until it has answered (or failed to, within the manager's deadlines).
func (l *loop) sockets() (map[key][]Plugin, bool) {
	n := l.n
	socks := map[key][]Plugin{}
	unasked := !closed(n.cfg.Scanned)
	for _, p := range n.cfg.Plugins() {
		if p.Type != "" && p.Name != "" {
			k := key{p.Type, p.Name}
			socks[k] = append(socks[k], p)
		} else if p.Unsettled {
			unasked = true
		}
	}
	for _, e := range n.cfg.Expect {
		if k := (key{e.Type, e.Name}); socks[k] == nil {
			socks[k] = nil
		}
	}
	return socks, unasked
}

// plan is what one evaluation decided: the conditions to set and the types
// to drop, extra entries to remove, the events to tell once the conditions
// are written, each expectation's state for the status API, whether every
// expected plugin is ready and whether this is a heartbeat.
type plan struct {
	set      []corev1.NodeCondition
	drop     []string
	extra    []entry
	notes    []event
	states   []ConditionState
	allReady bool
	beat     bool
}

// judgeAll judges each expected plugin's condition against the Node's
// (node) and fills p; it returns when to look again for a change it holds
// back. Nothing is to be written while the Node is not readable.
func (l *loop) judgeAll(now time.Time, node *corev1.Node, socks map[key][]Plugin, unasked bool, views map[key]view, readable bool, seq uint64, p *plan) time.Time {
	n := l.n
	var next time.Time
	p.allReady = true
	for _, e := range n.cfg.Expect {
		k := key{e.Type, e.Name}
		cur := findCondition(node, e.Condition)
		st := ConditionState{Expectation: e}
		if cur != nil {
			c := *cur
			st.Actual = &c
		}
		v, ok := judge(e, socks[k], unasked, views[k], n.cfg.RegistryDir)
		if !ok {
			p.allReady = false
			delete(l.held, e.Condition)
			p.states = append(p.states, st)
			continue
		}
		st.Want = &corev1.NodeCondition{Type: corev1.NodeConditionType(e.Condition), Status: v.status, Reason: v.reason, Message: v.message}
		n.setReady(e, v.status == corev1.ConditionTrue)
		p.allReady = p.allReady && v.status == corev1.ConditionTrue
		if sameVerdict(cur, v) {
			delete(l.written, e.Condition)
			delete(l.held, e.Condition)
			l.confirmed(e.Condition, v, now)
			if p.beat {
				p.set = append(p.set, nodeCondition(e.Condition, v, cur, now))
			}
			p.states = append(p.states, st)
			continue
		}
		st.Pending = true
		p.states = append(p.states, st)
		if !readable {
			continue
		}
		var written bool
		if cur, written = l.asWritten(e.Condition, v, cur, seq); written {
			continue // written; the informer has not brought it back yet
		}
		if due := l.writeDue(e, k, v, cur, now, node); now.Before(due) {
			next = earliest(next, due)
			continue
		}
		p.set = append(p.set, nodeCondition(e.Condition, v, cur, now))
		switch {
		case v.status == corev1.ConditionTrue && (cur == nil || cur.Status != corev1.ConditionTrue):
			cause := ""
			if v.reason != ReasonReady {
				cause = v.reason
			}
			p.notes = append(p.notes, event{corev1.EventTypeNormal, "PluginReady", k, cause, v.message})
			if cur != nil {
				n.m.notReady.WithLabelValues(e.Type).Observe(now.Sub(cur.LastTransitionTime.Time).Seconds())
			}
		case v.status != corev1.ConditionTrue && cur != nil && cur.Status == corev1.ConditionTrue:
			p.notes = append(p.notes, event{corev1.EventTypeWarning, "PluginNotReady", k, v.reason, v.message + " (" + v.reason + ")"})
		}
	}
	return next
}

// act writes what p says, in order: the extra entries removed, the
// conditions set and dropped (then their events), the startup taint
// removed. A write that fails stops the rest until the write backoff lets
// them go again. It returns when to look again.
func (l *loop) act(ctx context.Context, now time.Time, node *corev1.Node, p plan, beatDue, next time.Time) time.Time {
	n := l.n
	set, drop, extra, beat := p.set, p.drop, p.extra, p.beat
	if beat && len(set) == 0 {
		l.lastBeat = now // nothing plugd can vouch for now; the next look is a heartbeat away
	}
	if !beatDue.IsZero() {
		next = earliest(next, beatDue)
	}
	allReady := p.allReady && len(n.cfg.Expect) > 0
	var taint []byte // the patch that removes the startup taint, when it is due
	if allReady && n.taintKey != "" {
		if p, has, err := taintPatch(node, n.taintKey, n.taintEffect); has && err == nil {
			taint = p
		}
	}
	// A write that failed and is no longer needed (the plugin went back to
	// what the Node shows, the taint is gone) is no trouble any more.
	if len(set) == 0 && len(drop) == 0 && len(extra) == 0 {
		n.setWriteProblem(n.statusWrite.op, nil, "the failed write is no longer needed")
	}
	if taint == nil {
		n.setWriteProblem(n.taintWrite.op, nil, "the failed write is no longer needed")
	}
	if len(set) == 0 && len(drop) == 0 && len(extra) == 0 && taint == nil {
		return next
	}
	if now.Before(l.nextWrite) {
		return earliest(next, l.nextWrite)
	}
	if len(extra) > 0 && !l.removeExtras(ctx, now, extra) {
		return earliest(next, l.nextWrite)
	}
	if len(set) > 0 || len(drop) > 0 {
		if !l.writeConditions(ctx, now, node, set, drop, p.notes) {
			return earliest(next, l.nextWrite)
		}
		if beat {
			l.lastBeat = now
			next = earliest(next, now.Add(n.heartbeat))
		}
	}
	if taint != nil {
		if !l.write(ctx, now, n.taintWrite, func(ctx context.Context) error {
			_, err := n.core.Nodes().Patch(ctx, n.cfg.NodeName, types.JSONPatchType, taint, metav1.PatchOptions{FieldManager: fieldManager})
			return err
		}) {
			return earliest(next, l.nextWrite)
		}
		n.log.Info("every expected plugin is ready: taint removed", "node", n.cfg.NodeName, "taint", n.cfg.RemoveTaint)
	}
	return next
}

// viewCache is the views of an evaluation and what they were made of.
type viewCache struct {
	in    viewInputs
	socks map[key][]Plugin
	mem   map[key]remembered
	views map[key]view
	stale []staleEntry
	more  int
}

// viewInputs counts the informers' deliveries and the kubelet's reads
// before a snapshot: the same counts, the same objects. (A delivery while
// the snapshot is read counts at the next evaluation, which then builds
// the views again.)
type viewInputs struct {
	node, csiNode, slices uint64
	problems              [3]string
	kubelet               uint64
}

// views are the kubelet views of the plugins and CSINode's stale entries.
// When the sockets, the API objects and the kubelet's reads are those of
// the last evaluation, they are its views: the texts of a quiet node are
// not built again at every resync (with thousands of CSINode entries,
// hundreds of kilobytes every 5 seconds).
func (l *loop) views(socks map[key][]Plugin, snap snapshot, kf kubeletFacts, kn kubeletstate.Evidence) (map[key]view, []staleEntry, int) {
	in := viewInputs{node: snap.seq[0], csiNode: snap.seq[1], slices: snap.seq[2], kubelet: kn.Reads}
	for i, p := range []*Problem{snap.nodeProblem, snap.csiProblem, snap.sliceProblem} {
		if p != nil {
			in.problems[i] = p.Reason + ": " + p.Message
		}
	}
	c := &l.cache
	if c.views != nil && c.in == in && reflect.DeepEqual(c.socks, socks) && reflect.DeepEqual(c.mem, l.mem) {
		return c.views, c.stale, c.more
	}
	views := make(map[key]view, len(socks))
	for k, ps := range socks {
		views[k] = kubeletView(k, ps, snap, kf, l.mem[k])
	}
	stale, more := staleEntries(snap, socks, kf, kn)
	*c = viewCache{in: in, socks: socks, mem: maps.Clone(l.mem), views: views, stale: stale, more: more}
	return views, stale, more
}

// hold keeps v, which changes only the reason or message of condition
// typ, and returns when it is due to be written.
func (l *loop) hold(typ string, v verdict, now time.Time) time.Time {
	h := l.held[typ]
	switch {
	case h == nil:
		h = &heldVerdict{v: v, first: now, since: now}
		l.held[typ] = h
	case h.v != v:
		h.v, h.since = v, now
	}
	return earliest(h.since.Add(coalesce), h.first.Add(maxCoalesce))
}

// asWritten is the condition cond to judge verdict v against: the Node's,
// cur, unless plugd wrote cond since the Node updates seq the informer has
// delivered. Then the Node holds plugd's write, which the informer has not
// brought back (its watch can lag seconds behind an API server that came
// back): written says it is v already; otherwise v is judged against that
// write, so that a new reason is held as any is and a transition is told
// once.
func (l *loop) asWritten(cond string, v verdict, cur *corev1.NodeCondition, seq uint64) (*corev1.NodeCondition, bool) {
	w, ok := l.written[cond]
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
func (l *loop) writeDue(e Expectation, k key, v verdict, cur *corev1.NodeCondition, now time.Time, node *corev1.Node) time.Time {
	if due := l.overwritten(e, k, v, cur, now, node); now.Before(due) {
		return due
	}
	if cur != nil && cur.Status == v.status {
		if due := l.hold(e.Condition, v, now); now.Before(due) {
			return due
		}
	}
	delete(l.held, e.Condition)
	return time.Time{}
}

// beatDue is when plugd's conditions are due a heartbeat: heartbeat after
// the oldest of them was last written (zero: never).
func (l *loop) beatDue(node *corev1.Node) time.Time {
	if l.n.heartbeat <= 0 {
		return time.Time{}
	}
	var oldest time.Time
	for _, e := range l.n.cfg.Expect {
		if c := findCondition(node, e.Condition); c != nil && (oldest.IsZero() || c.LastHeartbeatTime.Time.Before(oldest)) {
			oldest = c.LastHeartbeatTime.Time
		}
	}
	if oldest.IsZero() {
		return time.Time{}
	}
	// The informer may not have brought the last write back yet.
	return latest(oldest, l.lastBeat).Add(l.n.heartbeat)
}

// remember keeps what each CSI driver last said of itself.
func (l *loop) remember(socks map[key][]Plugin) {
	for k, ps := range socks {
		if k.typ != TypeCSI {
			continue
		}
		for _, p := range ps {
			if id, topology := p.nodeInfo(); id != "" || len(topology) > 0 {
				l.mem[k] = remembered{nodeID: id, topology: topology}
			}
		}
	}
}

// observeRegistrations counts, once per socket, the time from its
// appearance (and from the kubelet's start, when it was there before) to
// the running kubelet having registered it, as the reads show it.
func (l *loop) observeRegistrations(socks map[key][]Plugin, kf kubeletFacts, kn kubeletstate.Evidence) {
	if !kf.live || kn.Reading == nil {
		return
	}
	present := map[string]bool{}
	for k, ps := range socks {
		for _, p := range ps {
			present[p.Socket] = true
			if !kf.registered[p.Socket] || p.Created.IsZero() {
				continue
			}
			if c, ok := l.registered[p.Socket]; ok && c.Equal(p.Created) {
				continue
			}
			l.registered[p.Socket] = p.Created
			since := kn.PresentSince(p.Socket)
			if since.IsZero() {
				since = kn.Reading.At
			}
			if d := since.Sub(p.Created); d >= 0 && d < time.Hour {
				l.n.m.registration.WithLabelValues(k.typ).Observe(d.Seconds())
			}
			if p.Created.Before(kn.Reading.Started) {
				if d := since.Sub(kn.Reading.Started); d >= 0 && d < time.Hour {
					l.n.m.afterStart.WithLabelValues(k.typ).Observe(d.Seconds())
				}
			}
		}
	}
	for s := range l.registered {
		if !present[s] {
			delete(l.registered, s)
		}
	}
}

// paceKubelet asks the kubelet watch for the reads the sockets need: while
// the kubelet and the sockets disagree, often for a while after the
// disagreement began (or the plugins last changed); while an expected
// device plugin waits for healthy devices, pod-resources every second.
func (l *loop) paceKubelet(now time.Time, socks map[key][]Plugin, views map[key]view, kf kubeletFacts, kn kubeletstate.Evidence) time.Time {
	unsettled := false
	if kf.live {
		for k, v := range views {
			answering := slices.ContainsFunc(socks[k], func(p Plugin) bool { return p.Answering })
			if answering != (v.State == api.KubeletRegistered) && k.typ != "" && v.Reason != "UnsupportedType" {
				unsettled = true
				break
			}
		}
	}
	changes := l.n.localChanges.Load()
	switch {
	case !unsettled:
		l.unsettledSince = time.Time{}
	case l.unsettledSince.IsZero() || changes != l.localChanges:
		l.unsettledSince = now
	}
	l.localChanges = changes
	var metrics, devices time.Time
	if !l.unsettledSince.IsZero() && kn.Reading != nil {
		switch d := now.Sub(l.unsettledSince); {
		case d < fastFor:
			metrics = kn.Reading.At.Add(unsettledFast)
		case d < slowFor:
			metrics = kn.Reading.At.Add(unsettledSlow)
		}
	}
	if kf.live && kn.Reading != nil {
		for _, e := range l.n.cfg.Expect {
			v := views[key{e.Type, e.Name}]
			if e.Type == TypeDevice && v.State == api.KubeletRegistered && v.healthy < e.MinHealthyDevices {
				// A poll from the last read of the devices: the last read
				// of the metrics is up to a resync old, and a wish from it
				// is in the past at once, every time (issue 33, item 4).
				devices = latest(kn.Reading.At, kn.DevicesAt).Add(devicesPoll)
			}
		}
	}
	l.n.kubelet.Want(metrics, devices)
	if !l.unsettledSince.IsZero() {
		// Look again when fast reads end, to slow them down.
		switch d := now.Sub(l.unsettledSince); {
		case d < fastFor:
			return l.unsettledSince.Add(fastFor)
		case d < slowFor:
			return l.unsettledSince.Add(slowFor)
		}
	}
	return time.Time{}
}

// writeConditions patches the Node's status: the conditions in set, and
// those of the types in drop deleted. Once that is written, it sends the
// events of the changes, about node.
func (l *loop) writeConditions(ctx context.Context, now time.Time, node *corev1.Node, set []corev1.NodeCondition, drop []string, notes []event) bool {
	n := l.n
	seq := n.nodeEvents.Load()
	if !l.write(ctx, now, n.statusWrite, func(ctx context.Context) error {
		patch, err := conditionsPatch(set, drop)
		if err == nil {
			_, err = n.core.Nodes().Patch(ctx, n.cfg.NodeName, types.StrategicMergePatchType, patch, metav1.PatchOptions{FieldManager: fieldManager}, "status")
		}
		return err
	}) {
		return false
	}
	for _, c := range set {
		l.written[string(c.Type)] = written{verdict{c.Status, c.Reason, c.Message}, seq, c}
		l.wrote(string(c.Type), verdict{c.Status, c.Reason, c.Message})
		if cur := findCondition(node, string(c.Type)); cur == nil || !sameVerdict(cur, verdict{c.Status, c.Reason, c.Message}) {
			n.log.Info("Node condition set", "node", n.cfg.NodeName, "condition", c.Type, "status", c.Status, "reason", c.Reason, "message", c.Message)
		}
	}
	for _, typ := range drop {
		l.written[typ] = written{seq: seq}
		n.log.Info("Node condition removed: plugd no longer expects its plugin", "node", n.cfg.NodeName, "condition", typ)
	}
	for _, e := range notes {
		l.record(node, e)
	}
	return true
}

// removeExtras removes the Node's condition entries es (extras).
func (l *loop) removeExtras(ctx context.Context, now time.Time, es []entry) bool {
	n := l.n
	seq := n.nodeEvents.Load()
	if !l.write(ctx, now, n.statusWrite, func(ctx context.Context) error {
		patch, err := removalPatch(es)
		if err == nil {
			_, err = n.core.Nodes().Patch(ctx, n.cfg.NodeName, types.JSONPatchType, patch, metav1.PatchOptions{FieldManager: fieldManager}, "status")
		}
		return err
	}) {
		return false
	}
	l.removed, l.removedSeq = true, seq
	for _, e := range es {
		n.log.Info("Node condition entry removed: a second entry of a type plugd writes, or one of plugd's beside another's", "node", n.cfg.NodeName,
			"condition", e.c.Type, "index", e.index, "status", e.c.Status, "reason", e.c.Reason)
	}
	return true
}

// writeOp is one kind of write plugd makes: what its Problem calls it, the
// permission it needs (as RBAC writes it), and its metrics' label.
type writeOp struct{ op, perm, metric string }

// fieldManager is who plugd's writes are from, in the objects' managedFields.
const fieldManager = nodecond.FieldManager

// write runs one write with a deadline, and keeps its outcome (noteWrite);
// a failure puts off every write by a backoff.
func (l *loop) write(ctx context.Context, now time.Time, w writeOp, do func(context.Context) error) bool {
	ctx, cancel := context.WithTimeoutCause(ctx, writeTimeout, fmt.Errorf("the API server did not answer within %s", writeTimeout))
	err := do(ctx)
	if ctx.Err() != nil && err != nil {
		err = fmt.Errorf("%w (%w)", err, context.Cause(ctx))
	}
	cancel()
	l.n.noteWrite(w, err, now)
	if err == nil {
		l.writeDelay.Reset()
		l.nextWrite = time.Time{}
		return true
	}
	l.nextWrite = now.Add(l.writeDelay.Next())
	return false
}

// noteWrite counts a write, and keeps its failure as the Problem of its
// operation until one succeeds (or is no longer needed).
func (n *Node) noteWrite(w writeOp, err error, now time.Time) {
	n.m.writes.WithLabelValues(w.metric).Inc()
	var p *Problem
	if err != nil {
		p = classify(w.op, w.perm, err, now)
		n.m.apiErrors.WithLabelValues(w.metric, p.Reason).Inc()
	}
	n.setWriteProblem(w.op, p, "writing again")
}

// setWriteProblem makes p the trouble of the write op (nil: none, for the
// reason ended), and logs each change of it once.
func (n *Node) setWriteProblem(op string, p *Problem, ended string) {
	n.mu.Lock()
	was := n.problems[op]
	switch {
	case p == nil && was == nil:
		n.mu.Unlock()
		return
	case p == nil:
		delete(n.problems, op)
	default:
		if was != nil && was.Reason == p.Reason {
			p.Since = was.Since
		}
		n.problems[op] = p
	}
	n.mu.Unlock()
	switch {
	case p == nil:
		n.log.Info("Kubernetes API: "+ended, "operation", op, "troubleSince", was.Since)
	case was == nil || was.Reason != p.Reason:
		n.log.Warn("Kubernetes API: cannot write; retrying with backoff", "operation", op, "reason", p.Reason, "err", p.Message)
	}
}

// closed says c is closed; a nil c counts as closed.
func closed(c <-chan struct{}) bool {
	if c == nil {
		return true
	}
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// Overwrites. A condition plugd wrote (or saw on the Node as it would
// write it), then finds changed by another writer while plugd's verdict is
// the same, was overwritten: a caretaker that judges plugd's heartbeat on a clock
// skewed from the node's, an operator's script, a second plugd. Writing it
// back at once, every time, is a fight that neither side wins (two PATCHes
// a second, the condition flipping, in issue 33). After fightUndos
// overwrites within fightWindow, plugd writes it back only after a delay
// doubling from fightDelayMin to fightDelayMax, and says so once (a
// warning in its log, a Warning event ConditionOverwritten on the Node);
// every overwrite counts in plugd_node_condition_overwritten_total. A
// condition left as plugd wrote it for fightWindow ends the fight.
// fight is what plugd knows of the overwrites of one condition.
type fight struct {
	seen    verdict   // plugd's verdict, as last seen on the Node
	shown   bool      // the Node shows seen now
	shownAt time.Time // since when
	// mine is the verdict plugd stands by on the Node: the last it wrote
	// or saw there. Only a change of it by another counts.
	mine verdict
	// pending are the verdicts plugd wrote since the Node last showed the
	// latest of them: a Node that shows one of them shows plugd's own
	// write, come back late, not another writer's.
	pending []verdict
	// answered says plugd wrote its verdict back (or saw it back) since
	// the last overwrite it counted: the next is another overwrite, seen
	// or not the write back.
	answered bool
	undos    int // overwrites since first
	first    time.Time
	delay    backoff.Backoff
	due      time.Time // no write back before
}

// maxPending bounds fight.pending: a verdict that flips faster than the
// informer echoes it has a write or two in flight, not more.
const maxPending = 4

// fightOf is the record of the overwrites of cond, made if need be.
func (l *loop) fightOf(cond string) *fight {
	f := l.fights[cond]
	if f == nil {
		f = &fight{delay: backoff.New(fightDelayMin, fightDelayMax, writeJitter), answered: true}
		l.fights[cond] = f
	}
	return f
}

// confirmed notes that the Node shows plugd's verdict v for cond at now.
func (l *loop) confirmed(cond string, v verdict, now time.Time) {
	f := l.fightOf(cond)
	if !f.shown || f.seen != v {
		f.seen, f.shown, f.shownAt = v, true, now
	}
	f.mine, f.answered = v, true
	if len(f.pending) > 0 && f.pending[len(f.pending)-1] == v {
		f.pending = nil // the latest write is back: the others are past
	}
	if f.undos > 0 && now.Sub(f.shownAt) >= fightWindow {
		if f.undos >= fightUndos {
			l.n.log.Info("Node condition: no longer overwritten", "node", l.n.cfg.NodeName, "condition", cond)
		}
		l.fights[cond] = &fight{seen: v, shown: true, shownAt: now, mine: v, answered: true, delay: backoff.New(fightDelayMin, fightDelayMax, writeJitter)}
	}
}

// wrote notes that plugd wrote its verdict v for cond: the write back of
// an overwrite, or a change of its own.
func (l *loop) wrote(cond string, v verdict) {
	f := l.fightOf(cond)
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
func (l *loop) overwritten(e Expectation, k key, v verdict, cur *corev1.NodeCondition, now time.Time, node *corev1.Node) time.Time {
	f := l.fights[e.Condition]
	if f == nil {
		return time.Time{}
	}
	switch {
	case f.mine != v:
		return time.Time{} // not an overwrite: plugd's verdict changed
	case cur != nil && slices.ContainsFunc(f.pending, func(p verdict) bool { return sameVerdict(cur, p) }):
		return time.Time{} // plugd's own write, come back late
	case !f.answered:
		return f.due // this overwrite is counted: wait out its delay
	}
	f.shown, f.answered = false, false
	l.n.m.overwritten.WithLabelValues(e.Condition).Inc()
	if f.undos == 0 || now.Sub(f.first) > fightWindow {
		f.undos, f.first = 0, now
	}
	f.undos++
	if f.undos < fightUndos {
		f.due = time.Time{}
		return f.due
	}
	wait := f.delay.Next()
	f.due = now.Add(wait)
	if f.undos == fightUndos {
		was := "it is gone"
		if cur != nil {
			was = fmt.Sprintf("it says %s, %s: %s", cur.Status, cur.Reason, cur.Message)
		}
		msg := fmt.Sprintf("another writer overwrote plugd's condition %s %d times within %s (%s); plugd writes it back after a delay, from %s up to %s, instead of at once: is plugd's caretaker older than this plugd, or does another program write this condition?",
			e.Condition, f.undos, fightWindow, was, fightDelayMin, fightDelayMax)
		l.n.log.Warn("Node condition overwritten again and again: backing off", "node", l.n.cfg.NodeName, "condition", e.Condition, "detail", msg)
		l.record(node, event{corev1.EventTypeWarning, "ConditionOverwritten", k, "", msg})
	}
	return f.due
}
