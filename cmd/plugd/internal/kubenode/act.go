package kubenode

import (
	"context"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/plugd/plugd/internal/nodecond"
)

// act carries out plan p, decided on facts f: it publishes the views and
// the conditions' states, logs, counts and tells what p says, asks the
// kubelet's watch for its reads, keeps p's memory, and makes the writes
// (writeAll). It returns when to look again.
func (l *loop) act(ctx context.Context, f facts, p plan) time.Time {
	n := l.n
	n.publish(f.views, f.now)
	n.setStale(f.stale, f.more)
	n.setMetricMissing(f.kubelet)
	for _, o := range p.observed {
		n.m.observe(o)
	}
	for _, cond := range p.overwrites {
		n.m.overwritten.WithLabelValues(cond).Inc()
	}
	for _, line := range p.logs {
		if line.warn {
			n.log.Warn(line.msg, line.args...)
		} else {
			n.log.Info(line.msg, line.args...)
		}
	}
	for _, e := range p.tell {
		l.record(f.node, e)
	}
	n.kubelet.Want(p.wantMetrics, p.wantDevices)
	for _, e := range n.cfg.Expect {
		if ready, ok := p.ready[e.Condition]; ok {
			n.setReady(e, ready)
		}
	}
	n.setConditions(p.states)
	l.mem = p.mem
	// The taints' states as decided (a removal pending), then as written:
	// a write may take up to writeTimeout, and what plugd leaves to
	// another writer is known now.
	l.taintsWrote = map[string]bool{}
	n.setTaints(taintStates(n.taints, f.node, l.taintsWrote, p.taints, l.mem.taints))
	if !f.readable {
		return p.next
	}
	next := l.writeAll(ctx, f, p)
	n.setTaints(taintStates(n.taints, f.node, l.taintsWrote, p.taints, l.mem.taints))
	return next
}

// writeAll writes what p says, in order: the extra entries removed, the
// conditions set and dropped (then their events), the startup taint
// removed. A write that fails stops the rest until the write backoff lets
// them go again. It returns when to look again.
func (l *loop) writeAll(ctx context.Context, f facts, p plan) time.Time {
	n, now, next := l.n, f.now, p.next
	// A write that failed and is no longer needed (the plugin went back to
	// what the Node shows, the taint is gone) is no trouble any more.
	if len(p.set) == 0 && len(p.drop) == 0 && len(p.extra) == 0 {
		n.setWriteProblem(n.statusWrite.op, nil, "the failed write is no longer needed")
	}
	if len(p.taints) == 0 {
		n.setWriteProblem(taintWriteOp, nil, "the failed write is no longer needed")
	}
	if len(p.set) == 0 && len(p.drop) == 0 && len(p.extra) == 0 && len(p.taints) == 0 {
		return next
	}
	if now.Before(l.nextWrite) {
		return earliest(next, l.nextWrite)
	}
	l.wrote = nil
	if len(p.extra) > 0 && !l.removeExtras(ctx, now, p.extra) {
		return earliest(next, l.nextWrite)
	}
	if len(p.set) > 0 || len(p.drop) > 0 {
		if !l.writeConditions(ctx, now, f.node, p.set, p.drop, p.notes) {
			return earliest(next, l.nextWrite)
		}
		if p.beat {
			l.mem.lastBeat = now
			next = earliest(next, now.Add(n.heartbeat))
		}
	}
	for _, c := range p.taints {
		if !l.writeTaint(ctx, now, f.node, c) {
			return earliest(next, l.nextWrite)
		}
	}
	return next
}

// taintWriteOp is what the Problem of a failed taint write is called.
const taintWriteOp = "patch the taints of the Node"

// writeTaint removes or puts back a taint, as c says, with a JSON patch
// that fails if the Node changed under it; once written, it keeps the
// rule's memory, tells the event and counts it.
func (l *loop) writeTaint(ctx context.Context, now time.Time, node *corev1.Node, c taintChange) bool {
	n := l.n
	w := writeOp{taintWriteOp, "patch nodes", "remove_taint"}
	if c.add {
		w.metric = "add_taint"
	}
	if !l.write(ctx, now, w, func(ctx context.Context) error {
		patch, err := l.taintPatchOf(node, c, now)
		if err == nil && patch != nil {
			_, err = n.core.Nodes().Patch(ctx, n.cfg.NodeName, types.JSONPatchType, patch, metav1.PatchOptions{FieldManager: fieldManager})
		}
		return err
	}) {
		return false
	}
	l.mem.taints[c.rule.String()] = c.after
	l.taintsWrote[c.rule.String()] = c.add
	n.m.taintWrites.WithLabelValues(c.rule.String(), c.reason).Inc()
	if !c.registered.IsZero() {
		n.m.taintRemoval.WithLabelValues(c.rule.String()).Observe(n.clock.Since(c.registered).Seconds())
	}
	typ := corev1.EventTypeNormal
	if c.reason == ReasonTaintReadded || c.reason == ReasonTaintRestored {
		typ = corev1.EventTypeWarning
	}
	l.record(node, event{typ: typ, reason: c.reason, action: taintAction(c), note: c.rule.String() + " " + c.message})
	n.log.Info("taint "+c.message, "node", n.cfg.NodeName, "taint", c.rule.String(), "reason", c.reason)
	return true
}

// taintPatchOf is the JSON patch of c. A removal tests the taint where
// node has it. An addition is made against the Node as plugd's write of
// its conditions in this act returned it, if there was one (that write
// changed its resourceVersion), else as node, and tests that
// resourceVersion, so that a concurrent change of the taints fails it
// rather than being undone; nil if the taint is there already.
func (l *loop) taintPatchOf(node *corev1.Node, c taintChange, now time.Time) ([]byte, error) {
	if !c.add {
		patch, _, err := taintPatch(node, c.rule.key, c.rule.effect)
		return patch, err
	}
	if l.wrote != nil && l.wrote.UID == node.UID {
		node = l.wrote
	}
	if slices.ContainsFunc(node.Spec.Taints, func(t corev1.Taint) bool { return t.Key == c.rule.key && t.Effect == c.rule.effect }) {
		return nil, nil
	}
	return addTaintPatch(node, c.rule, now)
}

// taintAction is the action of a taint write's event.
func taintAction(c taintChange) string {
	if c.add {
		return "Add taint " + c.rule.String()
	}
	return "Remove taint " + c.rule.String()
}

// writeConditions patches the Node's status: the conditions in set, and
// those of the types in drop deleted. Once that is written, it keeps what
// it wrote (memory) and sends the events of the changes, about node.
func (l *loop) writeConditions(ctx context.Context, now time.Time, node *corev1.Node, set []corev1.NodeCondition, drop []string, notes []event) bool {
	n := l.n
	seq := n.nodeEvents.Load()
	if !l.write(ctx, now, n.statusWrite, func(ctx context.Context) error {
		patch, err := conditionsPatch(set, drop)
		if err == nil {
			l.wrote, err = n.core.Nodes().Patch(ctx, n.cfg.NodeName, types.StrategicMergePatchType, patch, metav1.PatchOptions{FieldManager: fieldManager}, "status")
		}
		return err
	}) {
		return false
	}
	for _, c := range set {
		v := conditionVerdict{c.Status, c.Reason, c.Message}
		l.mem.written[string(c.Type)] = written{v, seq, c}
		l.mem.wrote(string(c.Type), v)
		if cur := findCondition(node, string(c.Type)); cur == nil || !sameVerdict(cur, v) {
			n.log.Info("Node condition set", "node", n.cfg.NodeName, "condition", c.Type, "status", c.Status, "reason", c.Reason, "message", c.Message)
		}
	}
	for _, typ := range drop {
		l.mem.written[typ] = written{seq: seq}
		n.log.Info("Node condition removed: plugd no longer expects its plugin", "node", n.cfg.NodeName, "condition", typ)
	}
	for _, e := range notes {
		l.record(node, e)
	}
	return true
}

// removeExtras removes the Node's condition entries es (extras).
func (l *loop) removeExtras(ctx context.Context, now time.Time, es []conditionEntry) bool {
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
	l.mem.removed, l.mem.removedSeq = true, seq
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
