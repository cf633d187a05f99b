package kubenode

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/plugd/plugd/internal/nodecond"
)

// The startup taints plugd removes: one per expected plugin that names
// one (Expectation.Taint), and the one for all (Config.RemoveTaint). A
// taint is removed when every plugin it waits for is ready. Another
// writer may put it back (a node manager that re-applies the node's
// registration taints, an autoscaler's template): within the startup
// window after the kubelet's start plugd removes such a re-add again, at
// most maxReRemovals times per boot of the kubelet, and says who did it;
// after the window it belongs to that writer's logic, and plugd leaves it
// and says who holds it. plugd never fights for a taint.

// The event reasons of plugd's taint writes.
const (
	ReasonTaintRemoved  = "TaintRemoved"  // its plugins are ready
	ReasonTaintReadded  = "TaintReadded"  // another writer put it back within the window: removed again
	ReasonTaintRestored = "TaintRestored" // retaint: a plugin that was ready is not any more
)

// defaultStartupWindow is how long after the kubelet's start a re-added
// taint is removed again, by default: a node manager that re-applies the
// registration taints does so within minutes of the node's boot.
const defaultStartupWindow = 10 * time.Minute

// maxReRemovals bounds how often plugd removes a taint another writer
// keeps putting back within the window, per boot of the kubelet.
const maxReRemovals = 3

// taintRule is one taint plugd manages: removed once every condition in
// conds is True; with retaint, put back when one of them turns False
// after plugd saw them all True.
type taintRule struct {
	key     string
	effect  corev1.TaintEffect
	conds   []string
	retaint bool
	all     bool // the taint for all (Config.RemoveTaint)
}

func (r taintRule) String() string { return r.key + ":" + string(r.effect) }

// taintRules gathers the taints of expect (entries that share a key share
// one rule) and global, the taint for all, into rules. It refuses what
// cannot be meant: one key with two effects, entries of one key that
// disagree about retaint, and the taint for all named by an entry too.
func taintRules(expect []Expectation, global string) ([]taintRule, error) {
	var rules []taintRule
	byKey := map[string]int{}
	for _, e := range expect {
		if e.Taint == "" {
			if e.Retaint {
				return nil, fmt.Errorf("%s %s: retaint is set, but taint is not: name the taint to put back (taint: KEY:EFFECT)", e.Type, e.Name)
			}
			continue
		}
		key, effect, err := ParseTaint(e.Taint)
		if err != nil {
			return nil, fmt.Errorf("%s %s: taint %w", e.Type, e.Name, err)
		}
		i, seen := byKey[key]
		if !seen {
			byKey[key] = len(rules)
			rules = append(rules, taintRule{key: key, effect: effect, conds: []string{e.Condition}, retaint: e.Retaint})
			continue
		}
		r := &rules[i]
		switch {
		case r.effect != effect:
			return nil, fmt.Errorf("%s %s: taint %s names the key %s with the effect %s, and another expected plugin with %s: one key, one effect", e.Type, e.Name, e.Taint, key, effect, r.effect)
		case r.retaint != e.Retaint:
			return nil, fmt.Errorf("%s %s: the expected plugins sharing the taint %s disagree about retaint: set it on all of them or none (plugd would both put it back and leave it)", e.Type, e.Name, r)
		}
		r.conds = append(r.conds, e.Condition)
	}
	if global == "" {
		return rules, nil
	}
	key, effect, err := ParseTaint(global)
	if err != nil {
		return nil, err
	}
	if _, seen := byKey[key]; seen {
		return nil, fmt.Errorf("the taint key %s is both removeTaintWhenReady and an expected plugin's taint: name it once (the taint for all, or each plugin's)", key)
	}
	all := make([]string, len(expect))
	for i, e := range expect {
		all[i] = e.Condition
	}
	return append(rules, taintRule{key: key, effect: effect, conds: all, all: true}), nil
}

// CheckTaints says what is wrong with the taints of expect (each entry's
// Taint, with defaults) and removeTaint, the taint for all, together:
// one key with two effects, entries of one key that disagree about
// retaint, a key named both ways.
func CheckTaints(expect []Expectation, removeTaint string) error {
	_, err := taintRules(expect, removeTaint)
	return err
}

// taintMemory is what plugd keeps of one rule's taint between evaluations,
// in this process.
type taintMemory struct {
	ready      bool      // every condition of the rule has been True (retaint needs it)
	removed    time.Time // plugd removed the taint, or saw it gone with the plugins ready
	restored   bool      // plugd put it back (retaint) and has not removed it since
	reRemovals int       // re-adds removed again in this boot of the kubelet
	boot       time.Time // the kubelet's start that reRemovals counts in
	left       *taintHolder
	// wrote is plugd's last write of it (removed, or put back), for the
	// status API; readdedBy the writer of the last re-add removed again.
	wrote     time.Time
	readdedBy string
}

// taintHolder is another writer's re-add of a taint that plugd leaves,
// past the window or the bound: who last wrote the Node's taints, since
// when.
type taintHolder struct {
	manager string
	since   time.Time
	why     string // why plugd leaves it (for the doctor)
}

// taintFacts is what a decision about taints is made from.
type taintFacts struct {
	now         time.Time
	kubeletBoot time.Time     // the running kubelet's start; zero if unknown
	window      time.Duration // the startup window after kubeletBoot
	taints      []corev1.Taint
	owner       taintHolder // the last writer of the Node's taint list (managedFields)
	// conds is each condition of plugd's as decided now: its status, and
	// since when (its last transition).
	conds map[string]condNow
}

type condNow struct {
	status corev1.ConditionStatus
	since  time.Time
}

// taintChange is a taint write plugd decided on.
type taintChange struct {
	rule    taintRule
	add     bool   // put back; else removed
	reason  string // one of the taint event reasons
	by      string // the field manager that re-added it (ReasonTaintReadded)
	message string
	after   taintMemory // the rule's memory once the write is made
	// registered is, for a removal as its plugins are ready, when plugd
	// first knew the kubelet held them all (registeredAt); zero if unknown.
	registered time.Time
}

// decideTaints decides, for every rule, whether its taint is removed, put
// back, or left, from the facts and what plugd remembers; it returns the
// writes and the memory to keep once they are done. It does no I/O.
func decideTaints(rules []taintRule, f taintFacts, mem map[string]taintMemory) ([]taintChange, map[string]taintMemory) {
	var out []taintChange
	next := make(map[string]taintMemory, len(rules))
	for _, r := range rules {
		m := mem[r.String()]
		if !f.kubeletBoot.IsZero() && !m.boot.Equal(f.kubeletBoot) {
			m.boot, m.reRemovals, m.left = f.kubeletBoot, 0, nil // a new boot, a new window
		}
		c, m := decideTaint(r, f, m)
		if c != nil {
			out = append(out, *c)
		}
		next[r.String()] = m
	}
	return out, next
}

// decideTaint is decideTaints for one rule.
func decideTaint(r taintRule, f taintFacts, m taintMemory) (*taintChange, taintMemory) {
	allTrue, anyFalse, readySince := r.state(f.conds)
	present := slices.ContainsFunc(f.taints, func(t corev1.Taint) bool { return t.Key == r.key && t.Effect == r.effect })
	m.ready = m.ready || allTrue
	switch {
	case !present && allTrue:
		if m.removed.IsZero() {
			m.removed = f.now // gone already: a later one is a re-add
		}
		m.restored, m.left = false, nil
	case !present && anyFalse && r.retaint && m.ready && !m.restored:
		m.restored, m.left, m.wrote = true, nil, f.now
		return &taintChange{rule: r, add: true, reason: ReasonTaintRestored,
			message: "put back: " + strings.Join(r.falseConds(f.conds), ", ") + " not ready"}, m
	case present && allTrue:
		return r.decideRemoval(f, m, readySince)
	}
	return nil, m
}

// decideRemoval decides about rule r's taint, present while every plugin
// it waits for is ready. A taint plugd has not removed yet, or put back
// itself, or whose list was last written before the plugins were ready
// (the node's registration taint) goes. One written since by another
// writer is a re-add: removed again within the window and the bound,
// else left to that writer.
func (r taintRule) decideRemoval(f taintFacts, m taintMemory, readySince time.Time) (*taintChange, taintMemory) {
	byOther := f.owner.manager != "" && f.owner.manager != nodecond.FieldManager
	readded := !m.restored && byOther && (!m.removed.IsZero() || f.owner.since.After(readySince))
	switch {
	case !readded:
		m.removed, m.restored, m.left, m.wrote = f.now, false, nil, f.now
		return &taintChange{rule: r, reason: ReasonTaintRemoved, message: "removed: " + strings.Join(r.conds, ", ") + " ready"}, m
	case f.kubeletBoot.IsZero() || !f.now.Before(f.kubeletBoot.Add(f.window)) || m.reRemovals >= maxReRemovals:
		m.left = &taintHolder{manager: f.owner.manager, since: f.owner.since, why: leftWhy(f, m)}
		return nil, m
	}
	m.removed, m.left, m.wrote, m.readdedBy = f.now, nil, f.now, f.owner.manager
	m.reRemovals++
	return &taintChange{rule: r, reason: ReasonTaintReadded, by: f.owner.manager,
		message: fmt.Sprintf("re-added by %s within %s of the kubelet's start: removed again (%d of at most %d)", f.owner.manager, f.window, m.reRemovals, maxReRemovals)}, m
}

// leftWhy says why plugd leaves a re-added taint to its writer.
func leftWhy(f taintFacts, m taintMemory) string {
	switch {
	case f.kubeletBoot.IsZero():
		return "plugd cannot read the kubelet's start, so it cannot tell whether the startup window is over"
	case m.reRemovals >= maxReRemovals:
		return fmt.Sprintf("plugd removed it again %d times in this boot of the kubelet, its bound", m.reRemovals)
	}
	return fmt.Sprintf("it was put back after the startup window (%s after the kubelet's start at %s)", f.window, f.kubeletBoot.UTC().Format(time.RFC3339))
}

// state says whether every condition of r is True, whether one is False,
// and since when they have all been True.
func (r taintRule) state(conds map[string]condNow) (allTrue, anyFalse bool, readySince time.Time) {
	allTrue = len(r.conds) > 0
	for _, c := range r.conds {
		n := conds[c]
		switch n.status {
		case corev1.ConditionTrue:
			if n.since.After(readySince) {
				readySince = n.since
			}
		case corev1.ConditionFalse:
			anyFalse, allTrue = true, false
		default:
			allTrue = false
		}
	}
	return allTrue, anyFalse, readySince
}

func (r taintRule) falseConds(conds map[string]condNow) []string {
	var out []string
	for _, c := range r.conds {
		if conds[c].status == corev1.ConditionFalse {
			out = append(out, c)
		}
	}
	return out
}

// taintsOwner is who last wrote n's taint list, and when
// (nodecond.TaintsWriter: the list is atomic, so its one owner is its last
// writer).
func taintsOwner(n *corev1.Node) taintHolder {
	manager, since := nodecond.TaintsWriter(n)
	return taintHolder{manager: manager, since: since}
}

// ownsTaints says whether a managedFields entry's fields hold spec.taints.
func ownsTaints(raw []byte) bool {
	var fields struct {
		Spec map[string]json.RawMessage `json:"f:spec"`
	}
	if json.Unmarshal(raw, &fields) != nil {
		return false
	}
	_, ok := fields.Spec["f:taints"]
	return ok
}

// taintsOwnerFields is the managedFields plugd keeps of a writer of the
// Node's taints (slimNode): the manager and the time, not the fields.
var taintsOwnerFields = &metav1.FieldsV1{Raw: []byte(`{"f:spec":{"f:taints":{}}}`)}

// addTaintPatch is the JSON patch that puts the taint of r on n, if n has
// not changed since it was read (its resourceVersion), so that a
// concurrent change of its taints fails it instead of being undone.
func addTaintPatch(n *corev1.Node, r taintRule, now time.Time) ([]byte, error) {
	t := corev1.Taint{Key: r.key, Effect: r.effect}
	if r.effect == corev1.TaintEffectNoExecute {
		at := metav1.NewTime(now)
		t.TimeAdded = &at
	}
	ops := []map[string]any{{"op": "test", "path": "/metadata/resourceVersion", "value": n.ResourceVersion}}
	if len(n.Spec.Taints) == 0 {
		ops = append(ops, map[string]any{"op": "add", "path": "/spec/taints", "value": []corev1.Taint{t}})
	} else {
		ops = append(ops, map[string]any{"op": "add", "path": "/spec/taints/-", "value": t})
	}
	return json.Marshal(ops)
}
