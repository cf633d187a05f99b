// Package kubenode is plugd on a Kubernetes node: what the running kubelet
// made of each plugin, a Node condition per expected plugin, the removal
// of a startup taint once they are all ready, and events when one becomes
// ready, falls out, or when the kubelet and the sockets disagree.
//
// The evidence is the kubelet's own state, which API objects outlive:
//
//	its /metrics (secure port)   plugin_manager_total_plugins: the sockets it has registered
//	                             (actual state) and seen (desired state); its start time
//	its pod-resources socket     the devices it can allocate now
//
// and, for the details, this node's objects, read with informers scoped by
// field selectors: its Node (metadata.name), its CSINode (metadata.name)
// and its ResourceSlices (spec.nodeName). Where the kubelet cannot be read
// (permission, TLS, no answer), what it registered is inferred from those
// objects, and every view and condition says Inferred.
//
// Files by job. The walk from a kubelet fact to the Node PATCH reads top
// down in three: gather.go (Run, and one evaluation's facts: the sockets,
// the informers' snapshot, the kubelet's evidence, the views they make,
// the clock), decide.go (decide: a pure function from the facts and the
// loop's memory to a plan: conditions to set and drop, the taint, events,
// logs, metrics, the reads of the kubelet wished for, the next wake-up,
// the new memory) and act.go (the plan carried out, then the memory
// kept). Beside them: input.go is what the daemon gives it (Socket: each
// registration socket as the manager's snapshot has it, with its
// handler's details, the types of package api from which it reads a CSI
// driver's node id and topology and a device plugin's healthy devices);
// package kubeletstate reads the kubelet, checks who answers at its
// address, says when to read, and keeps what the reads showed (Evidence);
// view.go says what the kubelet made of a plugin; conditions.go what its
// condition says (judge) and the patches; events.go sends events;
// source.go reads the API's objects; status.go is what the daemon and the
// doctor read back; timing.go is the table of its timing constants.
//
// It writes only on change, and for a heartbeat: a condition is patched
// (strategic merge on nodes/status, so that every condition of others
// stays) when its status changes, when its reason or message changes and
// has held for a moment, and every heartbeat interval. An API server or a
// kubelet that is down, slow or forbids plugd never holds up anything
// local: the views say why, Problems lists the API's trouble, and reads
// and writes are retried with backoff until they work again. Its pacing,
// heartbeats and backoff run on an injected clock.
package kubenode
