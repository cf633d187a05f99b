package kubenode

import (
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
)

// DriverSlices counts the ResourceSlices published for this node now, by
// driver, as the informer holds them (read when asked: the doctor's
// question, not the loop's). p says why the count cannot be trusted (the
// informer has not synced, or cannot read); counts is nil then.
func (n *Node) DriverSlices() (counts map[string]int, p *Problem) {
	if p := n.slices.trouble(); p != nil {
		return nil, p
	}
	counts = map[string]int{}
	for _, obj := range n.slices.inf.GetStore().List() {
		if s, ok := obj.(*resourcev1.ResourceSlice); ok {
			counts[s.Spec.Driver]++
		}
	}
	return counts, nil
}

// kubeletVersion is the kubelet's version as the Node reports it
// (status.nodeInfo.kubeletVersion); empty while the Node is not read.
func (n *Node) kubeletVersion() string {
	if obj, ok, _ := n.node.inf.GetStore().GetByKey(n.cfg.NodeName); ok {
		if node, ok := obj.(*corev1.Node); ok {
			return node.Status.NodeInfo.KubeletVersion
		}
	}
	return ""
}
