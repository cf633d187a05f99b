// Package kubenode is plugd on a Kubernetes node: what the Kubernetes API
// says the kubelet made of each plugin, a Node condition per expected
// plugin, the removal of a startup taint once they are all ready, and
// events when one becomes ready, falls out, or when the kubelet and the
// socket disagree.
//
// It reads only this node's objects, with informers scoped by field
// selectors: its Node (metadata.name), its CSINode (metadata.name) and its
// ResourceSlices (spec.nodeName). What the kubelet writes there is the
// evidence:
//
//	CSIPlugin     the driver is in CSINode spec.drivers, with the nodeID the driver's NodeGetInfo gives
//	DevicePlugin  the resource is in the Node's status.capacity; allocatable counts its healthy devices
//	DRAPlugin     the driver's ResourceSlices on this node exist (none: Unknown, not published)
//
// It writes only on change: a condition is patched (strategic merge on
// nodes/status, so that every condition of others stays) when its status,
// reason or message changes, never periodically. An API server that is
// down, slow or forbids plugd never holds up anything local: the views say
// Unknown with the reason, Problems lists the trouble, and reads and writes
// are retried with backoff until they work again.
//
// Summarize reads the conditions back across a cluster, for plugctl
// cluster.
package kubenode
