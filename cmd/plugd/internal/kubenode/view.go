package kubenode

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	storagev1 "k8s.io/api/storage/v1"

	"github.com/plugd/plugd/api"
)

// The plugin types the kubelet registers itself.
const (
	TypeCSI    = "CSIPlugin"
	TypeDRA    = "DRAPlugin"
	TypeDevice = "DevicePlugin"
)

// Plugin is one registration socket as plugd sees it, with what its handler
// knows that can be held against the kubelet's side.
type Plugin struct {
	Socket string
	Type   string
	Name   string
	// State is plugd's state of the socket (Registered, Answering, Stale...).
	State string
	// Answering says the socket is served and its plugin answers: Registered
	// when managing, Answering when observing.
	Answering bool
	// NodeID is what a CSI driver's NodeGetInfo answered; empty if the
	// handler does not ask.
	NodeID string
	// DevicesKnown says a device plugin's handler knows its devices:
	// Devices of them, HealthyDevices healthy.
	DevicesKnown            bool
	Devices, HealthyDevices int
}

// key names a plugin across its sockets, as the kubelet knows it.
type key struct{ typ, name string }

func (k key) String() string { return k.typ + " " + k.name }

// snapshot is what the informers hold of this node at one moment, and
// whether each read is sound.
type snapshot struct {
	nodeName string
	node     *corev1.Node
	csiNode  *storagev1.CSINode
	slices   []*resourcev1.ResourceSlice
	// Read trouble of each, nil while its informer is synced and healthy.
	nodeProblem, csiProblem, sliceProblem *Problem
}

// Reasons of a KubeletView that say the API could not be read, rather than
// what it shows: a condition is left as it is while one holds.
var apiReasons = []string{ReasonAPIUnavailable, ReasonForbidden, ReasonUnauthorized, ReasonNotServed, ReasonNotSynced}

// view is a KubeletView and, for a device plugin, the kubelet's count of
// its healthy devices (the Node's allocatable).
type view struct {
	api.KubeletView
	allocatable int
}

// kubeletView says what the API shows the kubelet made of plugin k, given
// plugd's sockets of it. Since is left for the caller.
func kubeletView(k key, socks []Plugin, s snapshot) view {
	v := kubeletViewOf(k, socks, s)
	if k.typ == TypeDevice && s.node != nil && v.State == api.KubeletRegistered {
		alloc := s.node.Status.Allocatable[corev1.ResourceName(k.name)]
		return view{v, int(alloc.Value())}
	}
	return view{KubeletView: v}
}

func kubeletViewOf(k key, socks []Plugin, s snapshot) api.KubeletView {
	unknown := func(p *Problem) api.KubeletView {
		return api.KubeletView{State: api.KubeletUnknown, Reason: p.Reason, Message: p.Message}
	}
	switch k.typ {
	case TypeCSI:
		if s.csiProblem != nil {
			return unknown(s.csiProblem)
		}
		if s.csiNode == nil {
			return api.KubeletView{State: api.KubeletNotRegistered, Reason: "NoCSINode",
				Message: fmt.Sprintf("there is no CSINode %s: the kubelet creates it when it starts, so it has registered no CSI driver", s.nodeName)}
		}
		var names []string
		for _, d := range s.csiNode.Spec.Drivers {
			if d.Name != k.name {
				names = append(names, d.Name)
				continue
			}
			var said []string
			for _, p := range socks {
				if p.NodeID != "" && !slices.Contains(said, p.NodeID) {
					said = append(said, p.NodeID)
				}
			}
			if len(said) > 0 && !slices.Contains(said, d.NodeID) {
				return api.KubeletView{State: api.KubeletRegistered, Reason: "NodeIDMismatch",
					Message: fmt.Sprintf("CSINode %s lists the driver with nodeID %q, but its NodeGetInfo answers %q: the kubelet registered an older instance, or the Node was re-created", s.nodeName, d.NodeID, strings.Join(said, `", "`))}
			}
			return api.KubeletView{State: api.KubeletRegistered,
				Message: fmt.Sprintf("in CSINode %s spec.drivers with nodeID %q", s.nodeName, d.NodeID)}
		}
		listed := "none"
		if len(names) > 0 {
			listed = strings.Join(names, ", ")
		}
		return api.KubeletView{State: api.KubeletNotRegistered, Reason: "NotInCSINode",
			Message: fmt.Sprintf("CSINode %s spec.drivers does not list it (it lists: %s)", s.nodeName, listed)}

	case TypeDevice:
		if s.nodeProblem != nil {
			return unknown(s.nodeProblem)
		}
		if s.node == nil {
			return api.KubeletView{State: api.KubeletUnknown, Reason: "NodeMissing",
				Message: fmt.Sprintf("there is no Node %s", s.nodeName)}
		}
		res := corev1.ResourceName(k.name)
		capacity, ok := s.node.Status.Capacity[res]
		if !ok {
			return api.KubeletView{State: api.KubeletNotRegistered, Reason: "NotInCapacity",
				Message: fmt.Sprintf("Node %s status.capacity has no %s", s.nodeName, k.name)}
		}
		if capacity.IsZero() {
			return api.KubeletView{State: api.KubeletNotRegistered, Reason: "CapacityZero",
				Message: fmt.Sprintf("Node %s has capacity 0 of %s: the kubelet dropped the resource after its plugin went", s.nodeName, k.name)}
		}
		alloc := s.node.Status.Allocatable[res]
		if healthy, devices, known := deviceCounts(socks); known && alloc.Value() != int64(healthy) {
			return api.KubeletView{State: api.KubeletRegistered, Reason: "AllocatableMismatch",
				Message: fmt.Sprintf("Node %s has %s allocatable of %s, but the plugin reports %d healthy of %d devices", s.nodeName, alloc.String(), k.name, healthy, devices)}
		}
		msg := fmt.Sprintf("Node %s has capacity %s, allocatable %s of %s", s.nodeName, capacity.String(), alloc.String(), k.name)
		if alloc.IsZero() && !slices.ContainsFunc(socks, func(p Plugin) bool { return p.Answering }) {
			msg += ": its plugin went, and the kubelet keeps the capacity for a grace period (5 minutes) before it drops to 0"
		}
		return api.KubeletView{State: api.KubeletRegistered, Message: msg}

	case TypeDRA:
		if s.sliceProblem != nil {
			return unknown(s.sliceProblem)
		}
		n := 0
		for _, sl := range s.slices {
			if sl.Spec.Driver == k.name {
				n++
			}
		}
		if n == 0 {
			return api.KubeletView{State: api.KubeletUnknown, Reason: "NoResourceSlices",
				Message: fmt.Sprintf("the driver has published no ResourceSlices for node %s: it may be registered and not have published yet (the kubelet deletes them when it deregisters the driver)", s.nodeName)}
		}
		return api.KubeletView{State: api.KubeletRegistered,
			Message: fmt.Sprintf("%d ResourceSlices of the driver on node %s", n, s.nodeName)}
	}
	return api.KubeletView{State: api.KubeletNotRegistered, Reason: "UnsupportedType",
		Message: fmt.Sprintf("the kubelet registers only %s, %s and %s plugins; it refuses type %s", TypeCSI, TypeDRA, TypeDevice, k.typ)}
}

// deviceCounts is a device plugin's devices as its handler sees them, from
// the socket that reports the most healthy ones (the serving instance,
// during a rolling update).
func deviceCounts(socks []Plugin) (healthy, devices int, known bool) {
	for _, p := range socks {
		if p.Answering && p.DevicesKnown && (!known || p.HealthyDevices > healthy) {
			healthy, devices, known = p.HealthyDevices, p.Devices, true
		}
	}
	return healthy, devices, known
}
