package nodecond

import (
	"encoding/json"
	"slices"
	"strings"

	"time"

	corev1 "k8s.io/api/core/v1"
)

// Conditions are n's conditions that are plugd's: in plugd's form (Owned),
// of a type the managedFields say FieldManager set (ManagedTypes). The
// message alone is no proof: the API checks nothing in a condition, and
// anyone who may update a Node's status can write one in plugd's form;
// only the API server writes managedFields. Of several entries of one type
// (a status PUT can make them), only the first is taken, as plugd keeps the
// first and removes the others at its next write: a plugin is counted once.
func Conditions(n *corev1.Node) []corev1.NodeCondition {
	var out []corev1.NodeCondition
	var mine map[string]bool
	for _, c := range n.Status.Conditions {
		if !Owned(c) {
			continue
		}
		if mine == nil {
			mine = ManagedTypes(n, FieldManager)
		}
		if mine[string(c.Type)] && !slices.ContainsFunc(out, func(o corev1.NodeCondition) bool { return o.Type == c.Type }) {
			out = append(out, c)
		}
	}
	return out
}

// ManagedTypes are the types of n's conditions that manager set through
// nodes/status, as the API server records it in n's managedFields.
func ManagedTypes(n *corev1.Node, manager string) map[string]bool {
	out := map[string]bool{}
	for _, mf := range n.ManagedFields {
		if mf.Manager != manager || mf.Subresource != "status" || mf.FieldsV1 == nil {
			continue
		}
		var fields struct {
			Status struct {
				Conditions map[string]json.RawMessage `json:"f:conditions"`
			} `json:"f:status"`
		}
		if json.Unmarshal(mf.FieldsV1.Raw, &fields) != nil {
			continue
		}
		for k := range fields.Status.Conditions { // k:{"type":"..."}: a list item, by its key
			var item struct {
				Type string `json:"type"`
			}
			if rest, ok := strings.CutPrefix(k, "k:"); ok && json.Unmarshal([]byte(rest), &item) == nil && item.Type != "" {
				out[item.Type] = true
			}
		}
	}
	return out
}

// LastWrite is when manager last changed what it holds of n's status, as
// the API server records it in n's managedFields (its own clock, whole
// seconds): plugd's heartbeat changes a field it holds at every write.
// Zero when n's managedFields say nothing of it. Unlike a condition's
// lastHeartbeatTime, which is the writer's clock, it is not off by the
// node's clock skew.
func LastWrite(n *corev1.Node, manager string) time.Time {
	var last time.Time
	for _, mf := range n.ManagedFields {
		if mf.Manager == manager && mf.Subresource == "status" && mf.Time != nil && mf.Time.After(last) {
			last = mf.Time.Time
		}
	}
	return last
}

// TaintsWriter is who last wrote n's taints, and when, by its
// managedFields (the API server's record and clock): the taint list is
// atomic, so its one owner is its last writer. Empty when they say
// nothing of the taints.
func TaintsWriter(n *corev1.Node) (manager string, at time.Time) {
	for _, mf := range n.ManagedFields {
		if mf.Subresource != "" || mf.FieldsV1 == nil || mf.Time == nil || mf.Time.Time.Before(at) {
			continue
		}
		var fields struct {
			Spec map[string]json.RawMessage `json:"f:spec"`
		}
		if json.Unmarshal(mf.FieldsV1.Raw, &fields) != nil {
			continue
		}
		if _, ok := fields.Spec["f:taints"]; ok {
			manager, at = mf.Manager, mf.Time.Time
		}
	}
	return manager, at
}
