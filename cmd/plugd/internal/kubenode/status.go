package kubenode

import (
	"fmt"
	"maps"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/plugd/plugd/cmd/plugd/internal/kubenode/kubeletstate"
)

// ConditionState is an expected plugin's Node condition: as the Node has
// it, and as plugd wants it.
type ConditionState struct {
	Expectation Expectation
	// Actual is the condition on the Node as plugd last read it; nil when
	// the Node has none.
	Actual *corev1.NodeCondition
	// Want is what plugd wants it to say (type, status, reason, message);
	// nil while plugd cannot tell (the API or the kubelet not read yet, a
	// socket not looked at yet).
	Want *corev1.NodeCondition
	// Pending says Want differs from Actual: the write is waiting (a
	// change of reason alone waits a moment), backing off, or failing
	// (Problems says why).
	Pending bool
}

// Conditions are the expected plugins' conditions at the last evaluation,
// in the order of Config.Expect. It is safe to call at any time.
func (n *Node) Conditions() []ConditionState {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]ConditionState(nil), n.conds...)
}

func (n *Node) setConditions(cs []ConditionState) {
	n.mu.Lock()
	n.conds = cs
	n.mu.Unlock()
}

// StaleEntry is a driver that CSINode lists while the running kubelet
// holds no registration of it: the kubelet failed to remove it (it tries
// once, at deregistration; an API outage then leaves it for good), and
// the scheduler still counts the driver on this node.
type StaleEntry struct {
	Driver, NodeID string
	// Index is the entry's place in spec.drivers, for the remedy's patch.
	Index int
	// Remedy is the command that removes it.
	Remedy string
}

// StaleCSINodeEntries are the CSINode's stale entries at the last
// evaluation, the first maxStaleEntries of them, and how many more there
// are; none unless the kubelet's own state is read.
func (n *Node) StaleCSINodeEntries() (entries []StaleEntry, more int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]StaleEntry(nil), n.stale...), n.staleMore
}

func (n *Node) setStale(s []staleEntry, more int) {
	out := make([]StaleEntry, 0, len(s))
	for _, e := range s {
		out = append(out, e.StaleEntry)
	}
	n.mu.Lock()
	n.stale, n.staleMore = out, more
	n.mu.Unlock()
}

// staleEntry is a StaleEntry with the text of its event.
type staleEntry struct {
	StaleEntry
	driver, message string
}

// maxStaleEntries bounds the stale CSINode entries plugd tells of (an
// event and a doctor finding each); the others are counted. Anyone who may
// update CSINode can add thousands.
const maxStaleEntries = 16

// staleEntries are the CSINode's entries the running kubelet holds no
// registration of, the first maxStaleEntries of them, and how many more
// there are. It says nothing unless the kubelet's state is read, and every
// socket it holds is one plugd knows the name of.
func staleEntries(s snapshot, socks map[key][]Socket, kf kubeletFacts, kn kubeletstate.Evidence) (out []staleEntry, more int) {
	if !kf.live || kn.Reading == nil || s.csiNode == nil || s.csiProblem != nil || kn.Reading.At.Sub(kn.Reading.Started) < staleSettle {
		return nil, 0
	}
	named := map[string]key{}
	for k, ps := range socks {
		for _, p := range ps {
			named[p.Path] = k
		}
	}
	held := map[string]bool{}
	// What the kubelet holds, and what it is registering again (credited
	// in kf.registered while its reconciler's pass runs).
	holding := map[string]bool{}
	maps.Copy(holding, kn.Reading.Registered)
	maps.Copy(holding, kf.registered)
	for p := range holding {
		k, ok := named[p]
		if !ok {
			return nil, 0 // a socket plugd does not know: it may be any driver's
		}
		if k.typ == TypeCSI {
			held[k.name] = true
		}
	}
	for i, d := range s.csiNode.Spec.Drivers {
		if held[d.Name] {
			continue
		}
		if len(out) == maxStaleEntries {
			more++
			continue
		}
		remedy := fmt.Sprintf(`kubectl patch csinode %s --type=json -p '[{"op":"test","path":"/spec/drivers/%d/name","value":%q},{"op":"remove","path":"/spec/drivers/%d"}]'`, s.nodeName, i, d.Name, i)
		out = append(out, staleEntry{
			StaleEntry: StaleEntry{Driver: d.Name, NodeID: d.NodeID, Index: i, Remedy: remedy},
			driver:     d.Name,
			message: fmt.Sprintf("CSINode %s lists the driver (nodeID %q), but the running kubelet holds no registration of it: the kubelet failed to remove the entry (it tries once, when it deregisters the driver) and the scheduler still counts the driver here; remove it (%s) or start the driver so that the kubelet registers it again",
				s.nodeName, d.NodeID, remedy),
		})
	}
	return out, more
}

// KubeletStatus is how plugd reads the kubelet now.
type KubeletStatus struct {
	// Address is the kubelet's secure port plugd reads; empty when off.
	Address string
	// Live says plugd reads the kubelet's own state; otherwise it infers
	// what the kubelet registered from API objects, and Problem says why
	// (KubeletNotRunning: nothing listens, so nothing is registered).
	Live    bool
	Problem *Problem
	// Started is the kubelet's start; Restarted says plugd saw it restart.
	Started   time.Time
	Restarted bool
	// Version is the kubelet's version as the Node reports it
	// (status.nodeInfo.kubeletVersion); empty while the Node is not read.
	Version string
	// ReadAt is the last good read; Registered and Seen count the sockets
	// its plugin manager held then, in its actual and desired states.
	ReadAt           time.Time
	Registered, Seen int
}

// Kubelet says how plugd reads the kubelet now. It is safe to call at any
// time.
func (n *Node) Kubelet() KubeletStatus {
	k := n.kubeletEvidence()
	st := KubeletStatus{Address: n.cfg.Kubelet.Address, Problem: problemOf(k.Problem), Restarted: k.Restarted, Version: n.kubeletVersion()}
	if s := k.Reading; s != nil {
		st.Started, st.ReadAt, st.Registered, st.Seen = s.Started, s.At, len(s.Registered), len(s.Seen)
		st.Live = k.Problem == nil
	}
	n.mu.Lock()
	missing := n.metricMissing
	n.mu.Unlock()
	if st.Live && missing != nil {
		p := *missing
		st.Live, st.Problem = false, &p
	}
	return st
}

// setMetricMissing keeps, for Kubelet, the trouble of a kubelet whose
// /metrics lacks the plugin manager's gauge (kf, live otherwise).
func (n *Node) setMetricMissing(kf kubeletFacts) {
	var p *Problem
	if kf.problem != nil && kf.problem.Reason == ReasonKubeletMetricMissing {
		p = kf.problem
	}
	n.mu.Lock()
	n.metricMissing = p
	n.mu.Unlock()
}
