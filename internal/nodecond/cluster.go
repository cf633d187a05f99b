package nodecond

import (
	"cmp"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// ClusterView is plugctl cluster's answer (what -o json prints): every expected plugin across the
// cluster's nodes.
type ClusterView struct {
	// Nodes is how many Node objects there are; NodesWithPlugd how many of
	// them carry at least one of plugd's conditions.
	Nodes          int             `json:"nodes"`
	NodesWithPlugd int             `json:"nodesWithPlugd"`
	Plugins        []ClusterPlugin `json:"plugins"`
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
}

// Summarize tells, from the nodes' conditions, each expected plugin's
// readiness across them, sorted by type and name. A condition is plugd's
// when its message is in plugd's form ("plugd: TYPE NAME: ..."); a node
// whose plugd expects nothing does not count.
func Summarize(nodes []corev1.Node) []ClusterPlugin {
	byKey := map[[3]string]*ClusterPlugin{}
	for _, n := range nodes {
		for _, c := range n.Status.Conditions {
			typ, name, ok := Parse(c.Message)
			if !ok {
				continue
			}
			k := [3]string{typ, name, string(c.Type)}
			cp := byKey[k]
			if cp == nil {
				cp = &ClusterPlugin{Type: typ, Name: name, Condition: string(c.Type)}
				byKey[k] = cp
			}
			cp.Expected++
			if c.Status == corev1.ConditionTrue {
				cp.Ready++
				continue
			}
			cp.NotReady = append(cp.NotReady, NodeCondition{Node: n.Name, Status: string(c.Status), Reason: c.Reason,
				Message: c.Message, Since: c.LastTransitionTime.Time})
		}
	}
	out := make([]ClusterPlugin, 0, len(byKey))
	for _, cp := range byKey {
		slices.SortFunc(cp.NotReady, func(a, b NodeCondition) int { return cmp.Compare(a.Node, b.Node) })
		out = append(out, *cp)
	}
	slices.SortFunc(out, func(a, b ClusterPlugin) int {
		return cmp.Or(cmp.Compare(a.Type, b.Type), cmp.Compare(a.Name, b.Name), cmp.Compare(a.Condition, b.Condition))
	})
	return out
}
