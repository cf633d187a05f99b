package kubenode

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	storagev1 "k8s.io/api/storage/v1"

	"github.com/plugd/plugd/api"
	"github.com/plugd/plugd/cmd/plugd/internal/kubenode/kubeletstate"
	"github.com/plugd/plugd/internal/textsafe"
)

// The plugin types the kubelet registers itself.
const (
	TypeCSI    = api.CSIPlugin
	TypeDRA    = api.DRAPlugin
	TypeDevice = api.DevicePlugin
)

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
	// seq counts the deliveries of the Node, CSINode and ResourceSlices
	// informers before it was read.
	seq [3]uint64
	// Read trouble of each, nil while its informer is synced and healthy.
	nodeProblem, csiProblem, sliceProblem *Problem
	// taintRules are the taints of the DeviceTaintRules, where the API
	// server serves them (nil otherwise), and the trouble of their reads.
	taintRules       []deviceTaint
	taintRuleProblem *Problem
	// classes are the DeviceClasses the expectations name, by name, and
	// classProblem the trouble reading them: while it is nil, a name
	// missing from classes is a class that does not exist. Both are nil
	// when no expectation names a class.
	classes      map[string]*resourcev1.DeviceClass
	classProblem *Problem
}

// Reasons of a KubeletView that say the API could not be read, rather than
// what it shows: a condition is left as it is while one holds.
var apiReasons = []string{ReasonAPIUnavailable, ReasonForbidden, ReasonUnauthorized, ReasonNotServed, ReasonNotSynced}

// The reasons of a KubeletView, besides those of a Problem.
const (
	// ReasonInferred: the kubelet's own state cannot be read; what it
	// registered is inferred from API objects, which outlive its
	// registrations (a CSINode entry survives a kubelet restart).
	ReasonInferred = "Inferred"
	// ReasonKubeletRestarted: the kubelet restarted and has not registered
	// the plugin since.
	ReasonKubeletRestarted = "KubeletRestarted"
	// ReasonSeenNotRegistered: the kubelet has seen the socket and not
	// registered it (it refused it, or cannot reach it).
	ReasonSeenNotRegistered = "SeenNotRegistered"
	// ReasonNotRegistered: the running kubelet holds no socket of it.
	ReasonNotRegistered = "NotRegistered"
	// ReasonTopologyConflict: the kubelet refuses the CSI driver because
	// the topology it reports collides with the Node's labels.
	ReasonTopologyConflict = "TopologyConflict"
)

// view is a KubeletView and, for a device plugin, the kubelet's count of
// its healthy devices.
type view struct {
	api.KubeletView
	healthy int
	// healthyFresh says healthy is the kubelet's live count
	// (pod-resources), not the Node's allocatable.
	healthyFresh bool
	// dra is, for a DRA driver, what its slices, health stream and the
	// DeviceTaintRules say of its devices; nil while its slices cannot be
	// read.
	dra *draState
}

// KubeletConfig says where plugd reads what the running kubelet holds
// (package kubeletstate).
type KubeletConfig = kubeletstate.Config

// The reasons the kubelet cannot be read (package kubeletstate), also the
// reasons of a Problem and of a kubelet view.
const (
	ReasonKubeletNotRunning   = kubeletstate.ReasonNotRunning   // nothing listens at its address
	ReasonKubeletUnreachable  = kubeletstate.ReasonUnreachable  // no answer: a timeout, no route
	ReasonKubeletTLS          = kubeletstate.ReasonTLS          // its serving certificate is not trusted
	ReasonKubeletForbidden    = kubeletstate.ReasonForbidden    // plugd lacks nodes/metrics
	ReasonKubeletUnauthorized = kubeletstate.ReasonUnauthorized // it does not accept plugd's credentials
	ReasonKubeletDisabled     = kubeletstate.ReasonDisabled     // kubernetes.kubelet.address is not set
	ReasonKubeletBadAnswer    = kubeletstate.ReasonBadAnswer    // it answered something else
	// ReasonKubeletMetricMissing: its /metrics has no plugin manager's
	// gauge while its registry holds sockets: the gauge is ALPHA, and
	// this kubelet renamed or dropped it (kubeletFactsOf).
	ReasonKubeletMetricMissing = "KubeletMetricMissing"
)

// kubeletFacts is what plugd knows of the running kubelet at one moment.
type kubeletFacts struct {
	// live says the kubelet's own state was read: registered holds the
	// sockets it registered (credited: a re-created socket counts once the
	// kubelet has registered it anew). down says nothing listens at its
	// address: it registers nothing.
	live, down bool
	registered map[string]bool
	seen       map[string]bool
	// reregistering says a path of registered is the kubelet's
	// registering it again (kubeletstate.Evidence.Reregistering): read
	// until it is back, or the pass it may take is over.
	reregistering bool
	// restarted says plugd saw the kubelet restart, at started.
	restarted bool
	started   time.Time
	// devices are its allocatable devices by resource (pod-resources);
	// nil when unknown.
	devices map[string]int
	// problem is why the kubelet cannot be read (nil while it can, or
	// before the first read).
	problem *Problem
	// address is where it is read, for messages; impostor, with down,
	// says who listens there that is not the kubelet.
	address, impostor string
}

// remembered is what plugd last knew of a CSI driver's NodeGetInfo, from
// any of its sockets: a registrar that the kubelet refused exits, and its
// socket says nothing more.
type remembered struct {
	nodeID   string
	topology map[string]string
}

// Bounds of the texts built from API objects: a view's message is served
// by the status API, logged, quoted by the doctor and in events; a list of
// names in it shows the first few and counts the rest.
const (
	maxViewMessage = 1024
	maxListed      = 8
)

// kubeletView says what the kubelet made of plugin k, given plugd's sockets
// of it. Since is left for the caller.
func kubeletView(k key, socks []Socket, s snapshot, kf kubeletFacts, mem remembered) view {
	v := kubeletViewOf(k, socks, s, kf, mem)
	v.Message = textsafe.Shorten(v.Message, maxViewMessage)
	if k.typ == TypeDRA && s.sliceProblem == nil && s.taintRuleProblem == nil {
		st := judgeDRA(s.slices, k.name, unhealthyDevices(socks), s.taintRules, s.classes != nil)
		v.dra = &st
		if v.State == api.KubeletRegistered {
			// The layers above registration, for plugctl get (minDevices
			// is the condition's: 1 here).
			_, why, text := draVerdict(st, 1)
			if why != "" {
				text = why + ": " + text
			}
			v.Message = textsafe.Shorten(v.Message+"; "+text, maxViewMessage)
		}
	}
	if k.typ != TypeDevice || v.State != api.KubeletRegistered {
		return v
	}
	if n, ok := kf.devices[k.name]; ok && kf.live {
		v.healthy, v.healthyFresh = n, true
	} else if s.node != nil {
		alloc := s.node.Status.Allocatable[corev1.ResourceName(k.name)]
		v.healthy = int(alloc.Value())
	}
	return v
}

func kubeletViewOf(k key, socks []Socket, s snapshot, kf kubeletFacts, mem remembered) view {
	if k.typ != TypeCSI && k.typ != TypeDRA && k.typ != TypeDevice {
		return view{KubeletView: api.KubeletView{State: api.KubeletNotRegistered, Reason: "UnsupportedType",
			Message: fmt.Sprintf("the kubelet registers only %s, %s and %s plugins; it refuses type %s", TypeCSI, TypeDRA, TypeDevice, k.typ)}}
	}
	switch {
	case kf.down && kf.impostor != "":
		return notRegistered(k, socks, s, mem, ReasonKubeletNotRunning,
			"the kubelet is not running: "+kf.impostor+", so the kubelet has registered nothing")
	case kf.down:
		return notRegistered(k, socks, s, mem, ReasonKubeletNotRunning,
			fmt.Sprintf("the kubelet is not running: nothing listens at %s, so it has registered nothing", kf.address))
	case kf.live:
		return liveView(k, socks, s, kf, mem)
	case kf.problem == nil:
		return view{KubeletView: api.KubeletView{State: api.KubeletUnknown, Reason: ReasonNotSynced,
			Message: "plugd has not read the kubelet yet"}}
	}
	v := inferredView(k, socks, s)
	if v.State == api.KubeletUnknown && slices.Contains(apiReasons, v.Reason) {
		return v
	}
	why := fmt.Sprintf(" (inferred from API objects, which outlive the kubelet's registrations: plugd cannot read the kubelet's own state, %s)", kf.problem.Reason)
	if v.State == api.KubeletRegistered && v.Reason == "" {
		v.Reason = ReasonInferred
	}
	v.Message += why
	if v.State != api.KubeletRegistered {
		if c := topologyConflict(k, s, mem); c != "" {
			v.Reason, v.Message = ReasonTopologyConflict, c
		}
	}
	return v
}

// liveView is the view from the kubelet's own state.
func liveView(k key, socks []Socket, s snapshot, kf kubeletFacts, mem remembered) view {
	var held, seen []string
	for _, p := range socks {
		switch {
		case kf.registered[p.Path]:
			held = append(held, p.Path)
		case kf.seen[p.Path]:
			seen = append(seen, p.Path)
		}
	}
	if len(held) == 0 {
		switch {
		case len(seen) > 0:
			return notRegistered(k, socks, s, mem, ReasonSeenNotRegistered,
				fmt.Sprintf("the kubelet has seen %s and not registered it: it refused it or cannot reach it, and retries with backoff", strings.Join(seen, ", ")))
		case kf.restarted && slices.ContainsFunc(socks, func(p Socket) bool { return p.Created.Before(kf.started) }):
			return notRegistered(k, socks, s, mem, ReasonKubeletRestarted, "the kubelet restarted and has not registered it since")
		}
		return notRegistered(k, socks, s, mem, ReasonNotRegistered, "the running kubelet's plugin manager holds no socket of it")
	}
	holds := "the kubelet's plugin manager holds " + strings.Join(held, ", ")
	v := api.KubeletView{State: api.KubeletRegistered, Message: holds}
	switch k.typ {
	case TypeCSI:
		if s.csiProblem != nil {
			break // registered all the same; CSINode adds only details
		}
		d := csiDriver(s.csiNode, k.name)
		said := nodeIDs(socks)
		if d == nil || len(said) > 0 && !slices.Contains(said, d.NodeID) {
			// The kubelet holds the socket while its CSI handler retries
			// the Node's update (seconds); a topology collision fails that
			// registration whatever the actual state says meanwhile.
			if c := topologyConflict(k, s, mem); c != "" {
				return view{KubeletView: api.KubeletView{State: api.KubeletNotRegistered, Reason: ReasonTopologyConflict, Message: c}}
			}
		}
		switch {
		case d == nil:
			v.Reason = "NotInCSINode"
			v.Message = holds + fmt.Sprintf(", but CSINode %s does not list the driver (yet)", s.nodeName)
		case len(said) > 0 && !slices.Contains(said, d.NodeID):
			v.Reason = "NodeIDMismatch"
			v.Message = fmt.Sprintf("%s, but CSINode %s lists the driver with nodeID %q while its NodeGetInfo answers %q", holds, s.nodeName, d.NodeID, strings.Join(said, `", "`))
		case limitsVolumes(socks) && (d.Allocatable == nil || d.Allocatable.Count == nil):
			// Ready means usable: without its count the scheduler would
			// place pods over the driver's attach limit.
			v.Reason = "NotInCSINode"
			v.Message = fmt.Sprintf("%s, but CSINode %s lists the driver without its attach limit (allocatable count) (yet), which its NodeGetInfo reports", holds, s.nodeName)
		default:
			v.Message = fmt.Sprintf("%s; CSINode %s lists it with nodeID %q", holds, s.nodeName, d.NodeID)
		}
	case TypeDevice:
		if n, ok := kf.devices[k.name]; ok {
			v.Message = fmt.Sprintf("%s; it can allocate %d %s devices (pod-resources)", holds, n, k.name)
		}
	case TypeDRA:
		if n := driverSlices(s.slices, k.name); n > 0 && s.sliceProblem == nil {
			v.Message = holds + "; " + slicesEvidence(n, k.name, s.nodeName)
		}
	}
	return view{KubeletView: v}
}

// notRegistered is a view of a plugin the kubelet has not registered:
// reason and text, unless the CSI driver's topology collides with the
// Node's labels, which is why.
func notRegistered(k key, socks []Socket, s snapshot, mem remembered, reason, text string) view {
	if c := topologyConflict(k, s, mem); c != "" && reason != ReasonKubeletNotRunning {
		return view{KubeletView: api.KubeletView{State: api.KubeletNotRegistered, Reason: ReasonTopologyConflict, Message: c}}
	}
	return view{KubeletView: api.KubeletView{State: api.KubeletNotRegistered, Reason: reason, Message: text}}
}

// topologyConflict says, for a CSI driver, which topology key it reports
// with another value than the Node's label of that key holds: the kubelet
// then refuses to register it ("detected topology value collision"). Empty
// if none.
func topologyConflict(k key, s snapshot, mem remembered) string {
	if k.typ != TypeCSI || s.node == nil || len(mem.topology) == 0 {
		return ""
	}
	var out []string
	for _, tk := range slices.Sorted(maps.Keys(mem.topology)) {
		if cur, ok := s.node.Labels[tk]; ok && cur != mem.topology[tk] {
			out = append(out, fmt.Sprintf("the driver reports %s=%s but Node %s has the label %s=%s", tk, mem.topology[tk], s.nodeName, tk, cur))
		}
	}
	if len(out) == 0 {
		return ""
	}
	return strings.Join(out, "; ") + fmt.Sprintf(": the kubelet refuses its registration (a topology value collision) and node-driver-registrar exits. Remove the stale label (kubectl label node %s %s-) if the driver's new value is right, or give the driver its old node id back", s.nodeName, slices.Sorted(maps.Keys(mem.topology))[0])
}

// inferredView says what the API objects show the kubelet made of plugin
// k: what plugd says when it cannot read the kubelet itself.
func inferredView(k key, socks []Socket, s snapshot) view {
	unknown := func(p *Problem) view {
		return view{KubeletView: api.KubeletView{State: api.KubeletUnknown, Reason: p.Reason, Message: p.Message}}
	}
	switch k.typ {
	case TypeCSI:
		if s.csiProblem != nil {
			return unknown(s.csiProblem)
		}
		if s.csiNode == nil {
			return view{KubeletView: api.KubeletView{State: api.KubeletNotRegistered, Reason: "NoCSINode",
				Message: fmt.Sprintf("there is no CSINode %s: the kubelet creates it when it starts, so it has registered no CSI driver", s.nodeName)}}
		}
		d := csiDriver(s.csiNode, k.name)
		if d == nil {
			drivers := s.csiNode.Spec.Drivers
			return view{KubeletView: api.KubeletView{State: api.KubeletNotRegistered, Reason: "NotInCSINode",
				Message: fmt.Sprintf("CSINode %s spec.drivers does not list it (it lists: %s)", s.nodeName,
					some(len(drivers), func(i int) string { return drivers[i].Name }))}}
		}
		if said := nodeIDs(socks); len(said) > 0 && !slices.Contains(said, d.NodeID) {
			return view{KubeletView: api.KubeletView{State: api.KubeletRegistered, Reason: "NodeIDMismatch",
				Message: fmt.Sprintf("CSINode %s lists the driver with nodeID %q, but its NodeGetInfo answers %q: the kubelet registered an older instance, or the Node was re-created", s.nodeName, d.NodeID, strings.Join(said, `", "`))}}
		}
		return view{KubeletView: api.KubeletView{State: api.KubeletRegistered,
			Message: fmt.Sprintf("in CSINode %s spec.drivers with nodeID %q", s.nodeName, d.NodeID)}}

	case TypeDevice:
		if s.nodeProblem != nil {
			return unknown(s.nodeProblem)
		}
		if s.node == nil {
			return view{KubeletView: api.KubeletView{State: api.KubeletUnknown, Reason: "NodeMissing",
				Message: fmt.Sprintf("there is no Node %s", s.nodeName)}}
		}
		res := corev1.ResourceName(k.name)
		capacity, ok := s.node.Status.Capacity[res]
		if !ok {
			return view{KubeletView: api.KubeletView{State: api.KubeletNotRegistered, Reason: "NotInCapacity",
				Message: fmt.Sprintf("Node %s status.capacity has no %s", s.nodeName, k.name)}}
		}
		if capacity.IsZero() {
			return view{KubeletView: api.KubeletView{State: api.KubeletNotRegistered, Reason: "CapacityZero",
				Message: fmt.Sprintf("Node %s has capacity 0 of %s: the kubelet dropped the resource after its plugin went", s.nodeName, k.name)}}
		}
		alloc := s.node.Status.Allocatable[res]
		// The handler's count is held against the Node's only when it was
		// taken after the Node's last status report: an older look says
		// nothing of now.
		if healthy, devices, at, known := deviceCounts(socks); known && alloc.Value() != int64(healthy) && newerThanNode(at, s.node) {
			return view{KubeletView: api.KubeletView{State: api.KubeletRegistered, Reason: "AllocatableMismatch",
				Message: fmt.Sprintf("Node %s has %s allocatable of %s, but the plugin reported %d healthy of %d devices since", s.nodeName, alloc.String(), k.name, healthy, devices)}}
		}
		msg := fmt.Sprintf("Node %s has capacity %s, allocatable %s of %s", s.nodeName, capacity.String(), alloc.String(), k.name)
		if alloc.IsZero() && !slices.ContainsFunc(socks, func(p Socket) bool { return p.Answering }) {
			msg += ": its plugin went, and the kubelet keeps the capacity for a grace period (5 minutes) before it drops to 0"
		}
		return view{KubeletView: api.KubeletView{State: api.KubeletRegistered, Message: msg}}

	default: // TypeDRA
		if s.sliceProblem != nil {
			return unknown(s.sliceProblem)
		}
		n := driverSlices(s.slices, k.name)
		if n == 0 {
			return view{KubeletView: api.KubeletView{State: api.KubeletUnknown, Reason: "NoResourceSlices",
				Message: fmt.Sprintf("the driver has published no ResourceSlices for node %s: it may be registered and not have published yet (the kubelet deletes them when it deregisters the driver)", s.nodeName)}}
		}
		return view{KubeletView: api.KubeletView{State: api.KubeletRegistered, Message: slicesEvidence(n, k.name, s.nodeName)}}
	}
}

// slicesEvidence says what n ResourceSlices of a DRA driver on a node
// show: the driver (or anyone who may create ResourceSlices) writes them,
// not the kubelet, which only deletes them once it lets the driver go.
func slicesEvidence(n int, driver, node string) string {
	return fmt.Sprintf("%d ResourceSlices for driver %s exist on node %s (published by the driver, not proof of kubelet registration)", n, driver, node)
}

// newerThanNode says a look taken at was after the Node's last status
// report (its Ready condition's heartbeat); a zero at is a live stream.
func newerThanNode(at time.Time, n *corev1.Node) bool {
	if at.IsZero() {
		return true
	}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return at.After(c.LastHeartbeatTime.Time)
		}
	}
	return false
}

// some names the first maxListed of n things and counts the others:
// "a, b, c and 2,997 more"; "none" for none.
func some(n int, name func(int) string) string {
	if n == 0 {
		return "none"
	}
	names := make([]string, 0, min(n, maxListed))
	for i := range min(n, maxListed) {
		names = append(names, name(i))
	}
	out := strings.Join(names, ", ")
	if n > maxListed {
		out += fmt.Sprintf(" and %d more", n-maxListed)
	}
	return out
}

func csiDriver(c *storagev1.CSINode, name string) *storagev1.CSINodeDriver {
	if c == nil {
		return nil
	}
	for i := range c.Spec.Drivers {
		if c.Spec.Drivers[i].Name == name {
			return &c.Spec.Drivers[i]
		}
	}
	return nil
}

func driverSlices(slices []*resourcev1.ResourceSlice, driver string) int {
	n := 0
	for _, sl := range slices {
		if sl.Spec.Driver == driver {
			n++
		}
	}
	return n
}

// kubeletFactsOf is what the kubelet's evidence ev says of the sockets
// socks, read at address: a socket counts as registered once the kubelet
// registered it, not an older socket at its path.
func kubeletFactsOf(ev kubeletstate.Evidence, address string, socks map[key][]Socket) kubeletFacts {
	kf := kubeletFacts{problem: problemOf(ev.Problem), restarted: ev.Restarted, address: address, impostor: ev.Impostor}
	if ev.Reading != nil {
		kf.started = ev.Reading.Started
	}
	switch {
	case ev.Problem != nil && (ev.Problem.Reason == ReasonKubeletNotRunning || ev.Impostor != ""):
		kf.down = true
		return kf
	case ev.Problem != nil || ev.Reading == nil:
		return kf
	case !ev.Reading.PluginMetric:
		if p := metricMissing(ev.Reading, address, socks); p != nil {
			kf.problem = p
			return kf
		}
	}
	kf.live, kf.seen, kf.devices = true, ev.Reading.Seen, ev.Reading.Devices
	kf.registered = map[string]bool{}
	for _, ps := range socks {
		for _, p := range ps {
			if ev.Credited(p.Path, p.Created) {
				kf.registered[p.Path] = true
			}
			if ev.Reregistering(p.Path, p.Created) {
				kf.reregistering = true
			}
		}
	}
	return kf
}

// problemOf is the kubelet's problem p as kubenode's, nil for nil.
func problemOf(p *kubeletstate.Problem) *Problem {
	if p == nil {
		return nil
	}
	q := Problem(*p)
	return &q
}

// metricMissing is the trouble of a kubelet whose reading r has no plugin
// manager's gauge while plugd sees sockets in its registry that it has
// had a pass (kubeletstate.Settle) to see, and that has run for
// staleSettle: the gauge is ALPHA, and a kubelet that renamed it in a new
// minor would otherwise say that it has registered nothing. Nil where the
// gauge's absence says that: no socket, none old enough, or a kubelet
// just started (its desired state is empty until its first pass).
func metricMissing(r *kubeletstate.Reading, address string, socks map[key][]Socket) *Problem {
	if r.At.Sub(r.Started) < staleSettle {
		return nil
	}
	var some string
	for _, ps := range socks {
		for _, p := range ps {
			if !p.Created.IsZero() && !r.At.Before(p.Created.Add(kubeletSettle)) {
				some = p.Path
			}
		}
	}
	if some == "" {
		return nil
	}
	return &Problem{Operation: "read the kubelet's /metrics at " + address, Reason: ReasonKubeletMetricMissing, Since: r.Started,
		Message: fmt.Sprintf("the kubelet's /metrics at %s has no plugin_manager_total_plugins, while its registry holds sockets (%s): the metric is ALPHA, and this kubelet renamed or dropped it; plugd cannot read what it registered and infers it from API objects. Check its name with: kubectl get --raw /api/v1/nodes/NODE/proxy/metrics | grep plugin_manager; and tell plugd's maintainers the kubelet's version", address, some)}
}
