package kubenode

import (
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/plugd/plugd/api"
)

// What the status API and the doctor show of the taints plugd manages
// (taints.go): each one's state as the Node has it after this
// evaluation's writes, and what this process remembers of it.

// taintState is one rule's taint as published: its view, and the
// conditions it waits for.
type taintState struct {
	conds []string
	view  api.TaintView
}

// HeldTaint is a startup taint plugd leaves to another writer: put back
// after the startup window, or more often than plugd removes it again.
type HeldTaint struct {
	// Taint is KEY:EFFECT; Plugins are the expected plugins it waits for
	// (TYPE NAME), all ready when plugd decided to leave it.
	Taint   string
	Plugins []string
	// Holder is the field manager that last wrote the Node's taints (its
	// managedFields), since Since; Why says why plugd leaves it.
	Holder string
	Since  time.Time
	Why    string
	// Node is the Node's name, for the remedy.
	Node string
}

// registeredAt is, for c, a removal of a taint whose plugins are ready,
// the first moment plugd knew the running kubelet held every plugin it
// waits for: over those plugins, the latest of the first read that showed
// one of its sockets registered. Zero for another change, and when plugd
// does not read the kubelet's own state or one of them is not held (the
// removal then cannot be timed from the registration).
func (d *decision) registeredAt(c taintChange) time.Time {
	kf, ev := d.f.kubelet, d.f.evidence
	if c.add || c.reason != ReasonTaintRemoved || !kf.live {
		return time.Time{}
	}
	var latest time.Time
	for _, cond := range c.rule.conds {
		var first time.Time // of any of its plugins (a resource's: any alternative)
		for _, m := range d.expectation(cond).mechanisms() {
			for _, p := range d.f.socks[key{m.Type, m.Name}] {
				since := ev.PresentSince(p.Path)
				if kf.registered[p.Path] && !since.IsZero() && (first.IsZero() || since.Before(first)) {
					first = since
				}
			}
		}
		if first.IsZero() {
			return time.Time{}
		}
		if first.After(latest) {
			latest = first
		}
	}
	return latest
}

// taintStates are the rules' taints as published after an evaluation: on
// node as it was read, but for the writes made since (wrote: by rule, on
// the Node now or not), pending the changes decided and not written, and
// what mem remembers.
func taintStates(rules []taintRule, node *corev1.Node, wrote map[string]bool, decided []taintChange, mem map[string]taintMemory) []taintState {
	out := make([]taintState, 0, len(rules))
	for _, r := range rules {
		id := r.String()
		present, ok := wrote[id]
		if !ok && node != nil {
			present = slices.ContainsFunc(node.Spec.Taints, func(t corev1.Taint) bool { return t.Key == r.key && t.Effect == r.effect })
		}
		m := mem[id]
		v := api.TaintView{Taint: id, All: r.all, ReRemovals: m.reRemovals, ReaddedBy: m.readdedBy}
		switch {
		case present && m.left != nil:
			v.State, v.Since, v.Holder, v.HeldBecause = api.TaintHeld, m.left.since, m.left.manager, m.left.why
		case present && m.restored:
			v.State, v.Since = api.TaintRestored, m.wrote
		case present:
			v.State = api.TaintPresent
		case !m.wrote.IsZero() && !m.restored:
			v.State, v.Since = api.TaintRemoved, m.wrote
		default:
			v.State = api.TaintAbsent
		}
		_, written := wrote[id]
		v.Pending = !written && slices.ContainsFunc(decided, func(c taintChange) bool { return c.rule.String() == id })
		out = append(out, taintState{conds: r.conds, view: v})
	}
	return out
}

func (n *Node) setTaints(ts []taintState) {
	n.mu.Lock()
	n.taintStates = ts
	n.mu.Unlock()
}

// TaintViews are the taints plugd manages that wait for the expected
// plugin of type typ and name, as the last evaluation left them; none if
// plugd does not expect it or it has no taint. It is safe to call at any
// time.
func (n *Node) TaintViews(typ, name string) []api.TaintView {
	var conds []string
	for _, e := range n.cfg.Expect {
		if slices.ContainsFunc(e.mechanisms(), func(m Expectation) bool { return m.Type == typ && m.Name == name }) {
			conds = append(conds, e.Condition) // its own entry's, or the resource's it is an alternative of
		}
	}
	if len(conds) == 0 {
		return nil
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []api.TaintView
	for _, s := range n.taintStates {
		if slices.ContainsFunc(conds, func(c string) bool { return slices.Contains(s.conds, c) }) {
			out = append(out, s.view)
		}
	}
	return out
}

// HeldTaints are the startup taints plugd leaves to another writer, as
// the last evaluation left them. It is safe to call at any time.
func (n *Node) HeldTaints() []HeldTaint {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []HeldTaint
	for _, s := range n.taintStates {
		v := s.view
		if v.State != api.TaintHeld {
			continue
		}
		h := HeldTaint{Taint: v.Taint, Holder: v.Holder, Since: v.Since, Why: v.HeldBecause, Node: n.cfg.NodeName}
		for _, e := range n.cfg.Expect {
			if slices.Contains(s.conds, e.Condition) {
				h.Plugins = append(h.Plugins, e.Type+" "+e.Name)
			}
		}
		out = append(out, h)
	}
	return out
}
