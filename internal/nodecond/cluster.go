package nodecond

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// ClusterView is the answer of plugctl cluster and kubectl plugd cluster
// (what -o json prints): every expected plugin across the cluster's nodes.
type ClusterView struct {
	// Nodes is how many Node objects there are; NodesWithPlugd how many of
	// them carry at least one of plugd's conditions.
	Nodes          int             `json:"nodes"`
	NodesWithPlugd int             `json:"nodesWithPlugd"`
	Plugins        []ClusterPlugin `json:"plugins"`
	// Source is where it was counted from: "nodes" (every Node, read by
	// the reader) or "summary" (plugd caretaker's, from the Nodes it
	// watches); AsOf is when it was counted, by the counter's clock.
	Source string    `json:"source,omitempty"`
	AsOf   time.Time `json:"asOf,omitzero"`
}

// ClusterPlugin is one expected plugin across a cluster: on how many nodes
// plugd expects it, and on how many it is ready, read from the conditions
// plugd writes.
type ClusterPlugin struct {
	Type      string `json:"type"`
	Name      string `json:"name"`
	Condition string `json:"condition"`
	Ready     int    `json:"ready"`
	Expected  int    `json:"expected"`
	// NotReady are the nodes where it is expected and not ready, by name.
	NotReady []NodeCondition `json:"notReady,omitempty"`
}

// NodeCondition is an expected plugin's condition on one node.
type NodeCondition struct {
	Node    string    `json:"node"`
	Status  string    `json:"status"`
	Reason  string    `json:"reason"`
	Message string    `json:"message"`
	Since   time.Time `json:"since,omitzero"`
	// Taints are the node's taints but Kubernetes' own, as KEY:EFFECT:
	// the startup taints that keep pods off while the plugin is not ready.
	Taints []string `json:"taints,omitempty"`
}

// MaxHeartbeatAge is how old a condition of plugd's may be, since it was
// last written, and still be maintained: plugd rewrites its conditions at
// least every 5 minutes (its heartbeat), so one older than twice that and
// a minute is left from a plugd that no longer runs, and says nothing of
// now.
const MaxHeartbeatAge = 11 * time.Minute

// ReasonNotMaintained is the reason a Census gives a condition older than
// its MaxAge.
const ReasonNotMaintained = "NotMaintained"

// ReasonPlugdNotRunning is the reason plugd's caretaker gives a condition
// it marks Unknown because plugd does not run on the node: its pod has not
// been Ready for a grace period, or the kubelet dropped a CSI driver from
// the node's CSINode and plugd did not follow.
const ReasonPlugdNotRunning = "PlugdNotRunning"

// Maintained says plugd has written the status of a Node within maxAge
// (zero: MaxHeartbeatAge) of now: written is LastWrite of the Node, by the
// API server's clock. A condition's lastHeartbeatTime is not the judge: it
// is the node's clock, and a node 20 minutes behind would have every
// condition of its live plugd called unmaintained, one 20 minutes ahead a
// dead plugd's maintained 20 minutes too long. A reader without history
// (plugctl cluster) holds the API server's record against its own clock,
// as kubectl's AGE column does; written zero (no record) is unknown, and
// counts as maintained: nothing says otherwise.
func Maintained(written, now time.Time, maxAge time.Duration) bool {
	if maxAge <= 0 {
		maxAge = MaxHeartbeatAge
	}
	return written.IsZero() || now.Sub(written) <= maxAge
}

// Census builds a ClusterView one node at a time, so that a reader can page
// through a large cluster and keep only what the view needs of each page.
// The zero value is an empty census that takes every condition as it says.
type Census struct {
	// Now, if set, is the time plugd's last write of a Node's status (the
	// API server's record of it, Maintained) is held against: a condition
	// on a Node plugd has not written within MaxAge (zero:
	// MaxHeartbeatAge) is not maintained, and counts as not ready,
	// Unknown/NotMaintained, whatever it says.
	Now    time.Time
	MaxAge time.Duration

	nodes, withPlugd int
	byKey            map[[3]string]*ClusterPlugin
}

// Add counts n: the node, and each of plugd's conditions on it
// (Conditions: n's managedFields are needed to tell them).
func (c *Census) Add(n *corev1.Node) {
	c.nodes++
	mine := Conditions(n)
	written := LastWrite(n, FieldManager)
	taints := StartupTaints(n)
	for _, cond := range mine {
		typ, name, _ := Parse(cond.Message)
		k := [3]string{typ, name, string(cond.Type)}
		cp := c.byKey[k]
		if cp == nil {
			if c.byKey == nil {
				c.byKey = map[[3]string]*ClusterPlugin{}
			}
			cp = &ClusterPlugin{Type: typ, Name: name, Condition: string(cond.Type)}
			c.byKey[k] = cp
		}
		cp.Expected++
		if !c.Now.IsZero() && cond.Status != corev1.ConditionUnknown && !Maintained(written, c.Now, c.MaxAge) {
			cp.NotReady = append(cp.NotReady, NodeCondition{Node: n.Name, Status: string(corev1.ConditionUnknown), Reason: ReasonNotMaintained,
				Message: fmt.Sprintf("plugd has not written this Node's status since %s, by the API server's record (it says %s, %s): is plugd running on this node?", written.UTC().Format(time.RFC3339), cond.Status, cond.Reason),
				Since:   written, Taints: taints})
			continue
		}
		if cond.Status == corev1.ConditionTrue {
			cp.Ready++
			continue
		}
		cp.NotReady = append(cp.NotReady, NodeCondition{Node: n.Name, Status: string(cond.Status), Reason: cond.Reason,
			Message: cond.Message, Since: cond.LastTransitionTime.Time, Taints: taints})
	}
	if len(mine) > 0 {
		c.withPlugd++
	}
}

// StartupTaints are n's taints but those Kubernetes owns (the kubelet's
// and the node lifecycle's: node.kubernetes.io/, node-role.kubernetes.io/,
// node-restriction.kubernetes.io/), as KEY:EFFECT; nil for none.
func StartupTaints(n *corev1.Node) []string {
	var out []string
	for _, t := range n.Spec.Taints {
		if strings.HasPrefix(t.Key, "node.kubernetes.io/") || strings.HasPrefix(t.Key, "node-role.kubernetes.io/") || strings.HasPrefix(t.Key, "node-restriction.kubernetes.io/") {
			continue
		}
		out = append(out, t.Key+":"+string(t.Effect))
	}
	return out
}

// View is what the census counted: the plugins sorted by type, name and
// condition, the nodes where each is not ready sorted by name.
func (c *Census) View() ClusterView {
	out := make([]ClusterPlugin, 0, len(c.byKey))
	for _, cp := range c.byKey {
		p := *cp
		p.NotReady = slices.Clone(p.NotReady)
		slices.SortFunc(p.NotReady, func(a, b NodeCondition) int { return cmp.Compare(a.Node, b.Node) })
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b ClusterPlugin) int {
		return cmp.Or(cmp.Compare(a.Type, b.Type), cmp.Compare(a.Name, b.Name), cmp.Compare(a.Condition, b.Condition))
	})
	return ClusterView{Nodes: c.nodes, NodesWithPlugd: c.withPlugd, Plugins: out}
}
