package kubenode

import (
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/plugd/plugd/internal/nodecond"
)

// One readiness across modes. An expectation may name a resource rather
// than a mechanism: {name: gpu.example.com, anyOf: [{type: DevicePlugin,
// name: example.com/gpu}, {type: DRAPlugin, name: gpu.example.com}]}. Its
// one condition is True while any alternative is ready, and its message
// says which one holds it ("held by DevicePlugin example.com/gpu: ...");
// False, with every alternative's reason, when none is. A consumer keys one
// readiness rule, label or alert on it and keeps it through a move from
// device plugins to DRA.
//
// The holder stays the holder while it is ready: a second alternative that
// becomes ready changes nothing, so the moment both run (the new driver
// started before the old one stops) costs no write. When the holder stops
// and another is ready, the condition says so at once (not after coalesce:
// the holder is what a reader wants to know). When the holder stops and no
// other is ready yet (the old one stopped before the new one registered),
// the condition stays True for switchGrace while the alternatives are
// judged again: one ready within it takes the condition over without a
// False ever written; none, and False is written when it ends.

// TypeAnyOf is the type of an expectation with alternatives, as its
// condition's message, the status API and the metrics' type label name
// it; no plugin may have it.
const TypeAnyOf = nodecond.Resource

// ReasonNoneReady is the reason of an anyOf condition that is False for
// several reasons, one per alternative, which its message gives.
const ReasonNoneReady = "NoneReady"

// maxAlternatives bounds anyOf: a resource has a mechanism or two, a few
// during a migration.
const maxAlternatives = 8

// withAlternatives checks e's alternatives and fills in their defaults,
// and makes e the resource's: Type TypeAnyOf. The rest of e (name,
// condition, taint) WithDefaults checks as for any entry.
func (e Expectation) withAlternatives() (Expectation, error) {
	switch {
	case e.Type != "" && e.Type != TypeAnyOf:
		return e, fmt.Errorf("type %q and anyOf are both set: an entry names one plugin (type and name) or a resource and the plugins that may provide it (name and anyOf), not both", e.Type)
	case len(e.AnyOf) == 0:
		return e, fmt.Errorf("type %s is plugd's name for an entry with anyOf, and this one lists no alternatives: list them in anyOf, or name the plugin's own type", TypeAnyOf)
	case len(e.AnyOf) > maxAlternatives:
		return e, fmt.Errorf("anyOf lists %d alternatives: at most %d", len(e.AnyOf), maxAlternatives)
	case e.Name == "":
		return e, errors.New("an entry with anyOf needs a name: the resource's (gpu.example.com), which its condition is named after")
	}
	alts := make([]Expectation, len(e.AnyOf))
	seen := map[key]int{}
	for i, a := range e.AnyOf {
		switch {
		case len(a.AnyOf) > 0 || a.Type == TypeAnyOf:
			return e, fmt.Errorf("anyOf[%d] has an anyOf of its own: list every alternative in the entry's one anyOf", i)
		case a.Condition != "" || a.Taint != "" || a.Retaint:
			return e, fmt.Errorf("anyOf[%d]: condition, taint and retaint are the entry's, not one alternative's: set them beside anyOf", i)
		}
		// An alternative has no condition of its own: a valid stand-in
		// spares it the default condition's checks, which its name need
		// not pass.
		a.Condition = "plugd.example/Alternative"
		a, err := a.WithDefaults()
		if err != nil {
			return e, fmt.Errorf("anyOf[%d]: %w", i, err)
		}
		a.Condition = ""
		k := key{a.Type, a.Name}
		if j, dup := seen[k]; dup {
			return e, fmt.Errorf("anyOf[%d]: %s is also anyOf[%d]", i, k, j)
		}
		seen[k] = i
		alts[i] = a
	}
	e.Type, e.AnyOf = TypeAnyOf, alts
	return e, nil
}

// mechanisms are the plugins e waits for: its alternatives, or e itself.
func (e Expectation) mechanisms() []Expectation {
	if e.Type == TypeAnyOf {
		return e.AnyOf
	}
	return []Expectation{e}
}

// expectedPlugins are the plugins of expect: each entry's mechanisms.
func expectedPlugins(expect []Expectation) []Expectation {
	var out []Expectation
	for _, e := range expect {
		out = append(out, e.mechanisms()...)
	}
	return out
}

// judgeExpectation is judge for any expectation: for one with
// alternatives, judgeAnyOf, which keeps the holder the Node's condition
// cur names, each alternative judged as a plain entry is (a CSI driver's
// wait for CSINode included: wait is when it ends).
func (d *decision) judgeExpectation(e Expectation, cur *corev1.NodeCondition) (_ conditionVerdict, ok bool, wait time.Time) {
	f := d.f
	if e.Type != TypeAnyOf {
		k := key{e.Type, e.Name}
		v, ok := judge(e, f.socks[k], f.unasked, f.views[k], d.pol.registryDir)
		return v, ok, time.Time{}
	}
	holder := ""
	if cur != nil && cur.Status == corev1.ConditionTrue {
		if typ, name, ok := nodecond.Holder(cur.Message); ok {
			holder = typ + " " + name
		}
	}
	alts := make([]alternativeVerdict, len(e.AnyOf))
	var held time.Time // the end of a republish grace its holder is in
	for i, a := range e.AnyOf {
		k := key{a.Type, a.Name}
		id := e.Condition + " " + k.String() // its wait for CSINode, remembered apart from the entry's
		alts[i].v, alts[i].ok = judge(a, f.socks[k], f.unasked, f.views[k], d.pol.registryDir)
		if alts[i].ok {
			delete(d.m.notInCSINode, id)
			if a.Type == TypeDRA && k.String() == holder {
				alts[i].v, held = d.republished(id, alts[i].v, heldAs(cur))
			}
			continue
		}
		var w time.Time
		alts[i].v, alts[i].ok, w = d.notInCSINodeOf(a, id, f.views[k])
		wait = earliest(wait, w)
	}
	v, ok := judgeAnyOf(e, alts, holder)
	if ok {
		wait = held
	}
	return v, ok, wait
}

// heldAs is a resource's True condition cur as the verdict of the
// alternative that holds it: "plugd: TYPE NAME: ...", the text after
// "held by ". A DRA driver that holds it keeps it through a republish
// (republished) as a plain entry does.
func heldAs(cur *corev1.NodeCondition) *corev1.NodeCondition {
	c := *cur
	_, rest, _ := strings.Cut(strings.TrimPrefix(cur.Message, nodecond.Prefix), ": ")
	c.Message = nodecond.Prefix + strings.TrimPrefix(rest, nodecond.HeldBy)
	return &c
}

// alternativeVerdict is judge's answer for one alternative.
type alternativeVerdict struct {
	v  conditionVerdict
	ok bool
}

// judgeAnyOf combines the verdicts of e's alternatives (in e.AnyOf's
// order): True, held by holder ("TYPE NAME") if it is ready, else by the
// first that is; undecided (ok false) while none is ready and one cannot
// be told; False otherwise, with the reasons of all.
func judgeAnyOf(e Expectation, alts []alternativeVerdict, holder string) (conditionVerdict, bool) {
	first, undecided := -1, false
	for i, a := range alts {
		switch {
		case !a.ok:
			undecided = true
		case a.v.status != corev1.ConditionTrue:
		case first < 0, key{e.AnyOf[i].Type, e.AnyOf[i].Name}.String() == holder:
			first = i
		}
	}
	if first >= 0 {
		a := alts[first]
		return conditionVerdict{corev1.ConditionTrue, a.v.reason, nodecond.Message(TypeAnyOf, e.Name, nodecond.HeldBy+ownText(a.v.message))}, true
	}
	if undecided {
		return conditionVerdict{}, false
	}
	// Each alternative's reason first, then what each says: a message cut
	// to its bound still gives every reason.
	reason := alts[0].v.reason
	var reasons, texts []string
	for i, a := range alts {
		if a.v.reason != reason {
			reason = ReasonNoneReady
		}
		reasons = append(reasons, key{e.AnyOf[i].Type, e.AnyOf[i].Name}.String()+": "+a.v.reason)
		texts = append(texts, ownText(a.v.message))
	}
	text := "none ready (" + strings.Join(reasons, ", ") + "): " + strings.Join(texts, "; ")
	return conditionVerdict{corev1.ConditionFalse, reason, nodecond.Message(TypeAnyOf, e.Name, text)}, true
}

// ownText is a plugin's condition message without plugd's prefix:
// "DevicePlugin example.com/gpu: registered with the kubelet, ...".
func ownText(message string) string {
	return strings.TrimPrefix(message, nodecond.Prefix)
}

// switching says whether e's verdict v, False, waits while the Node's
// condition cur is True: for switchGrace from the first such verdict, an
// alternative may take over (above). due is when it is written.
func (d *decision) switching(e Expectation, v conditionVerdict, cur *corev1.NodeCondition) (due time.Time, held bool) {
	if len(e.AnyOf) < 2 || v.status == corev1.ConditionTrue || cur == nil || cur.Status != corev1.ConditionTrue {
		delete(d.m.switching, e.Condition)
		return time.Time{}, false
	}
	since, ok := d.m.switching[e.Condition]
	if !ok {
		since = d.f.now
		d.m.switching[e.Condition] = since
	}
	if due = since.Add(switchGrace); d.f.now.Before(due) {
		return due, true
	}
	return time.Time{}, false
}

// holderChanged says v, True, names another holder than cur, True too.
func holderChanged(cur *corev1.NodeCondition, v conditionVerdict) bool {
	if cur == nil || cur.Status != corev1.ConditionTrue || v.status != corev1.ConditionTrue {
		return false
	}
	t1, n1, ok1 := nodecond.Holder(cur.Message)
	t2, n2, ok2 := nodecond.Holder(v.message)
	return ok1 && ok2 && (t1 != t2 || n1 != n2)
}

// Holds are the conditions of expected resources the plugin (typ, name)
// holds: True on the Node, their message naming it. Safe at any time.
func (n *Node) Holds(typ, name string) []string {
	var out []string
	for _, c := range n.Conditions() {
		if c.Expectation.Type != TypeAnyOf || c.Actual == nil || c.Actual.Status != corev1.ConditionTrue {
			continue
		}
		if t, nm, ok := nodecond.Holder(c.Actual.Message); ok && t == typ && nm == name {
			out = append(out, c.Expectation.Condition)
		}
	}
	return out
}
