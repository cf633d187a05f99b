package kubenode

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/validate/content"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/plugd/plugd/api"
	"github.com/plugd/plugd/internal/nodecond"
)

// Expectation is a plugin the node must have, and the Node condition that
// says whether it has it.
type Expectation struct {
	Type, Name string
	// Condition is the Node condition's type. Empty means
	// DefaultCondition(Type, Name).
	Condition string
	// MinHealthyDevices, for a DevicePlugin, is how many healthy devices it
	// must have. Zero means 1.
	MinHealthyDevices int
	// MinDevices, for a DRAPlugin, is how many usable devices (untainted,
	// not Unhealthy, in complete pools) it must publish for this node.
	// Zero means 1.
	MinDevices int
	// DeviceClasses, for a DRAPlugin, are DeviceClasses that must exist and
	// select enough of its usable devices (deviceclass.Matcher). Empty:
	// none is checked.
	DeviceClasses []string
	// Taint, as KEY:EFFECT, is a taint of this plugin's, removed from the
	// Node once it is ready (taints.go); Retaint puts it back when the
	// plugin, once ready, is not any more.
	Taint   string
	Retaint bool
	// AnyOf, when set, makes e a resource's rather than one plugin's:
	// Name is the resource's, Type is TypeAnyOf, and the condition is True
	// while any of these plugins is ready (anyof.go). Each takes the fields
	// a plugin's entry takes for its type; none has a condition or taint of
	// its own.
	AnyOf []Expectation
}

// The reasons of plugd's Node conditions.
const (
	ReasonReady                = "PluginReady"
	ReasonSocketMissing        = "SocketMissing"
	ReasonNotAnswering         = "NotAnswering"
	ReasonKubeletNotRegistered = "KubeletNotRegistered"
	ReasonNoHealthyDevices     = "NoHealthyDevices"
	// A DRA driver's condition has the reasons of its layers (dra.go):
	// NoResourceSlices, PoolIncomplete, DevicesTainted, DevicesUnhealthy,
	// TooFewDevices. A condition may also carry the reason of the kubelet
	// view that made it what it is: Inferred (True, from API objects),
	// TopologyConflict, NodeIDMismatch, NotInCSINode, NodeMissing.
)

// DefaultCondition is the Node condition type of an expected plugin whose
// configuration names none: "<name>/<Type>Ready" for a name that is a DNS
// subdomain (csi.example.com/CSIPluginReady), and
// "<domain>/<resource>-<Type>Ready" for an extended resource name
// (vendor.example/gpu-DevicePluginReady). A custom type contributes its last
// path element (example.com/Greeter: GreeterReady); an entry with anyOf
// (TypeAnyOf) nothing: gpu.example.com/Ready, example.com/gpu-Ready. It returns an error,
// asking for an explicit condition, when the result would not be a valid
// condition type (a qualified name).
func DefaultCondition(typ, name string) (string, error) {
	kind := typ[strings.LastIndex(typ, "/")+1:]
	if typ == TypeAnyOf {
		kind = "" // a resource's: gpu.example.com/Ready
	}
	c := name + "/" + kind + "Ready"
	if strings.Contains(name, "/") {
		c = name + "-" + kind + "Ready"
	}
	if errs := content.IsLabelKey(c); len(errs) > 0 {
		return "", fmt.Errorf("the default condition type %q for %s %s is not valid (%s): set condition to a qualified name such as example.com/PluginReady", c, typ, name, strings.Join(errs, "; "))
	}
	return c, nil
}

// WithDefaults returns e with its condition and device count filled in, or
// an error that names what is wrong.
func (e Expectation) WithDefaults() (Expectation, error) {
	if len(e.AnyOf) > 0 || e.Type == TypeAnyOf {
		var err error
		if e, err = e.withAlternatives(); err != nil {
			return e, err
		}
	}
	switch {
	case e.Type == "" || e.Name == "":
		return e, errors.New("type and name are both needed, as the plugin sends them in GetInfo")
	case strings.ContainsFunc(e.Type+e.Name, func(r rune) bool { return r <= ' ' || r == ':' }):
		return e, fmt.Errorf("type %q and name %q may not contain spaces, colons or control characters", e.Type, e.Name)
	case e.MinHealthyDevices < 0:
		return e, fmt.Errorf("minHealthyDevices is %d: it must be positive", e.MinHealthyDevices)
	case e.MinHealthyDevices > 0 && e.Type != TypeDevice:
		return e, fmt.Errorf("minHealthyDevices applies to %s plugins, not %s", TypeDevice, e.Type)
	case e.MinDevices < 0:
		return e, fmt.Errorf("minDevices is %d: it must be positive", e.MinDevices)
	case e.MinDevices > 0 && e.Type != TypeDRA:
		return e, fmt.Errorf("minDevices applies to %s plugins, not %s", TypeDRA, e.Type)
	case e.Retaint && e.Taint == "":
		return e, errors.New("retaint is set, but taint is not: name the taint to put back (taint: KEY:EFFECT)")
	}
	if err := checkDeviceClasses(e); err != nil {
		return e, err
	}
	if e.Taint != "" {
		if _, _, err := ParseTaint(e.Taint); err != nil {
			return e, fmt.Errorf("taint %w", err)
		}
	}
	if e.Type == TypeDevice && e.MinHealthyDevices == 0 {
		e.MinHealthyDevices = 1
	}
	if e.Type == TypeDRA && e.MinDevices == 0 {
		e.MinDevices = 1
	}
	if e.Condition == "" {
		c, err := DefaultCondition(e.Type, e.Name)
		if err != nil {
			return e, err
		}
		e.Condition = c
	} else if errs := content.IsLabelKey(e.Condition); len(errs) > 0 {
		return e, fmt.Errorf("condition %q is not a valid Node condition type: %s", e.Condition, strings.Join(errs, "; "))
	}
	if slices.Contains(kubeletConditions, corev1.NodeConditionType(e.Condition)) {
		return e, fmt.Errorf("condition %q is the kubelet's: choose a type of your own, such as %s/PluginReady", e.Condition, e.Name)
	}
	if slices.Contains(npdConditions, e.Condition) {
		return e, fmt.Errorf("condition %q is node-problem-detector's, which writes it too: plugd's writes and its would undo each other; choose a type of your own, such as %s/PluginReady", e.Condition, e.Name)
	}
	return e, nil
}

// UsesDeviceClasses says e, or one of its alternatives, names
// DeviceClasses: plugd then reads them from the Kubernetes API.
func (e Expectation) UsesDeviceClasses() bool { return len(e.deviceClassNames()) > 0 }

// deviceClassNames are the DeviceClasses e and its alternatives name.
func (e Expectation) deviceClassNames() []string {
	names := slices.Clone(e.DeviceClasses)
	for _, a := range e.AnyOf {
		names = append(names, a.DeviceClasses...)
	}
	return names
}

// checkDeviceClasses checks the DeviceClasses e names: for a DRAPlugin
// only, each a valid DeviceClass name (a DNS subdomain), once.
func checkDeviceClasses(e Expectation) error {
	if len(e.DeviceClasses) > 0 && e.Type != TypeDRA {
		return fmt.Errorf("deviceClasses applies to %s plugins, not %s: a DeviceClass selects DRA devices", TypeDRA, e.Type)
	}
	for i, c := range e.DeviceClasses {
		if errs := content.IsDNS1123Subdomain(c); len(errs) > 0 {
			return fmt.Errorf("deviceClasses[%d] %q is not a DeviceClass name (a DNS subdomain, such as gpu.example.com): %s", i, c, strings.Join(errs, "; "))
		}
		if slices.Contains(e.DeviceClasses[:i], c) {
			return fmt.Errorf("deviceClasses[%d] %q is listed twice: name each DeviceClass once", i, c)
		}
	}
	return nil
}

// npdConditions are the condition types node-problem-detector's shipped
// monitors write (its config/*.json): plugd never writes them either.
var npdConditions = []string{"KernelDeadlock", "ReadonlyFilesystem", "XfsShutdown", "FrequentUnregisterNetDevice",
	"FrequentKubeletRestart", "FrequentDockerRestart", "FrequentContainerdRestart", "CorruptDockerOverlay2",
	"KubeletUnhealthy", "ContainerRuntimeUnhealthy", "KubeProxyUnhealthy", "CsiProxyUnhealthy", "NTPProblem",
	"DiskSizeCheckFailure"}

// kubeletConditions are the condition types the kubelet (and the node
// lifecycle controller) own; plugd never writes them.
var kubeletConditions = []corev1.NodeConditionType{corev1.NodeReady, corev1.NodeMemoryPressure,
	corev1.NodeDiskPressure, corev1.NodePIDPressure, corev1.NodeNetworkUnavailable}

// ParseTaint reads KEY:EFFECT, the taint plugd removes once every expected
// plugin is ready. A key in a domain Kubernetes reserves is refused: such a
// taint belongs to Kubernetes (node.kubernetes.io/unschedulable is a cordon,
// node.kubernetes.io/not-ready the node lifecycle controller's), and plugd,
// which removes its taint whenever it comes back, would undo it each time.
func ParseTaint(s string) (key string, effect corev1.TaintEffect, err error) {
	k, e, ok := strings.Cut(s, ":")
	effect = corev1.TaintEffect(e)
	switch {
	case !ok || k == "":
		return "", "", fmt.Errorf("%q: write it as KEY:EFFECT, such as example.com/plugins-not-ready:NoSchedule", s)
	case len(content.IsLabelKey(k)) > 0:
		return "", "", fmt.Errorf("%q: the key %q is not a valid taint key: %s", s, k, strings.Join(content.IsLabelKey(k), "; "))
	case reservedTaintKey(k):
		return "", "", fmt.Errorf("%q: the key %q is in a domain Kubernetes reserves for its own taints (kubernetes.io and k8s.io, and their subdomains, such as node.kubernetes.io, whose unschedulable taint is a cordon): plugd would remove it every time Kubernetes puts it back; use a key of your own, such as example.com/plugins-not-ready, or a startup taint's (startup-taint.cluster-autoscaler.kubernetes.io/*, readiness.k8s.io/*, DRIVER.csi.k8s.io/*)", s, k)
	case !slices.Contains([]corev1.TaintEffect{corev1.TaintEffectNoSchedule, corev1.TaintEffectPreferNoSchedule, corev1.TaintEffectNoExecute}, effect):
		return "", "", fmt.Errorf("%q: the effect %q must be NoSchedule, PreferNoSchedule or NoExecute", s, e)
	}
	return k, effect, nil
}

// reservedTaintKey says whether a taint key's prefix is kubernetes.io or
// k8s.io, or a subdomain of either: the domains Kubernetes reserves for
// its own labels, annotations and taints (node.kubernetes.io/*,
// node-role.kubernetes.io/*, node-restriction.kubernetes.io/*,
// node.cloudprovider.kubernetes.io/uninitialized, ...). A key without a
// prefix is the user's. Three kinds of keys in those domains are startup
// taints others put on a node for a node agent to remove, and are not
// reserved (startupTaintDomains).
func reservedTaintKey(key string) bool {
	prefix, _, ok := strings.Cut(key, "/")
	if !ok {
		return false
	}
	for _, d := range startupTaintDomains {
		if sub, ok := strings.CutPrefix(d, "*."); ok && strings.HasSuffix(prefix, "."+sub) || prefix == d {
			return false
		}
	}
	for _, d := range []string{"kubernetes.io", "k8s.io"} {
		if prefix == d || strings.HasSuffix(prefix, "."+d) {
			return true
		}
	}
	return false
}

// startupTaintDomains are the prefixes in Kubernetes' domains whose taints
// nothing in Kubernetes puts back, made to be removed by whoever knows the
// node is ready (docs/cluster.md's recipes use each):
//   - startup-taint.cluster-autoscaler.kubernetes.io: Cluster Autoscaler's
//     startup taints (it ignores them when it simulates a new node and
//     counts a node with one as not ready yet); GKE documents this prefix
//     for startup taints;
//   - readiness.k8s.io: node-readiness-controller's taints, which Karpenter
//     also takes for startup taints;
//   - *.csi.k8s.io: the CSI drivers of kubernetes-sigs name their own
//     startup taint DRIVER/agent-not-ready (secrets-store.csi.k8s.io).
var startupTaintDomains = []string{"startup-taint.cluster-autoscaler.kubernetes.io", "readiness.k8s.io", "*.csi.k8s.io"}

// verdict is what an expected plugin's condition should say.
type conditionVerdict struct {
	status  corev1.ConditionStatus
	reason  string
	message string
}

// judge decides the condition of expected plugin e from its sockets and the
// kubelet view. ok is false when nothing can be concluded now (the API or
// the kubelet has not been read, or the plugin's sockets not looked at
// yet, or, with unasked, a socket that may be its not asked yet): the
// condition is then left alone. The message never holds
// anything that changes without the verdict changing (times, errors'
// text), so that a plugin that stays as it is costs no writes.
func judge(e Expectation, socks []Socket, unasked bool, v view, registryDir string) (conditionVerdict, bool) {
	no := func(reason, text string) (conditionVerdict, bool) {
		return conditionVerdict{corev1.ConditionFalse, reason, nodecond.Message(e.Type, e.Name, text)}, true
	}
	if v.Reason == ReasonTopologyConflict {
		return no(ReasonTopologyConflict, v.Message)
	}
	if len(socks) == 0 {
		if unasked {
			return conditionVerdict{}, false
		}
		return no(ReasonSocketMissing, fmt.Sprintf("no registration socket of it in %s", registryDir))
	}
	var answering *Socket
	for i := range socks {
		if socks[i].Answering {
			answering = &socks[i]
			break
		}
	}
	if answering == nil {
		if slices.ContainsFunc(socks, func(p Socket) bool { return p.Unsettled }) {
			return conditionVerdict{}, false // just found: plugd looks at it first
		}
		var states []string
		for _, p := range socks {
			states = append(states, fmt.Sprintf("%s is %s", p.Path, p.State))
		}
		return no(ReasonNotAnswering, "its socket does not answer: "+strings.Join(states, ", "))
	}
	switch {
	case v.State == api.KubeletUnknown && slices.Contains(apiReasons, v.Reason):
		return conditionVerdict{}, false
	case v.State == api.KubeletRegistered && v.Reason == "NotInCSINode":
		// The kubelet holds it and is writing CSINode: it adds the entry as
		// it registers the driver (and drops it for a moment when it
		// registers one again). A registration whose CSINode update fails
		// leaves its actual state: then it is not registered.
		return conditionVerdict{}, false
	case v.State == api.KubeletNotRegistered:
		return no(ReasonKubeletNotRegistered, "its socket answers, but the kubelet has not registered it: "+v.Message)
	case v.State == api.KubeletUnknown, v.Reason == "NodeIDMismatch":
		return no(v.Reason, v.Message)
	}
	reason, text := ReasonReady, "registered with the kubelet, socket "+answering.Path+" answers"
	if v.Reason == ReasonInferred {
		reason, text = ReasonInferred, text+" (inferred from API objects: plugd cannot read the kubelet's own state)"
	}
	if e.Type == TypeDevice {
		healthy := v.healthy
		// The kubelet's own count (pod-resources) is the truth; the
		// Node's allocatable lags it by a status update, so the handler's
		// count, when it is a live stream, may be fresher.
		if h, _, at, known := deviceCounts(socks); !v.healthyFresh && known && at.IsZero() && h < healthy {
			healthy = h
		}
		if healthy < e.MinHealthyDevices {
			return no(ReasonNoHealthyDevices, fmt.Sprintf("%d healthy devices, %d needed", healthy, e.MinHealthyDevices))
		}
		text += fmt.Sprintf(", %d healthy devices", healthy)
	}
	if e.Type == TypeDRA {
		if v.dra == nil {
			return conditionVerdict{}, false // its slices not read: nothing is concluded
		}
		ok, why, more := draVerdict(*v.dra, e.MinDevices, e.DeviceClasses...)
		switch {
		case !ok && why == "":
			return conditionVerdict{}, false // its classes not matched yet
		case !ok:
			return no(why, more)
		}
		text += ", " + more
	}
	return conditionVerdict{corev1.ConditionTrue, reason, nodecond.Message(e.Type, e.Name, text)}, true
}

// conditionsPatch is the strategic merge patch of the Node's status that
// sets the conditions in set and deletes those of the types in drop, and
// touches no other: the list merges by type, so every condition of others
// (the kubelet's, node-problem-detector's) stays.
func conditionsPatch(set []corev1.NodeCondition, drop []string) ([]byte, error) {
	items := make([]any, 0, len(set)+len(drop))
	for _, c := range set {
		items = append(items, c)
	}
	for _, typ := range drop {
		items = append(items, map[string]string{"type": typ, "$patch": "delete"})
	}
	return json.Marshal(map[string]any{"status": map[string]any{"conditions": items}})
}

// unexpected are the conditions on n that plugd wrote for plugins it no
// longer expects: a condition left True for a plugin nobody checks any more
// would keep telling readiness rules it is ready. A condition is plugd's
// when the API server's managedFields say plugd's field manager set it, and
// its message is in plugd's form (Owned): a message anyone can write, so
// that alone never gets a condition of others deleted.
//
// A type that also has an entry of others (a status PUT keeps several
// entries of one type) is not: its entries of plugd's are among extras.
func unexpected(n *corev1.Node, expect []Expectation) []string {
	var out []string
	mine, mixed := nodecond.ManagedTypes(n, fieldManager), mixedTypes(n)
	for _, c := range n.Status.Conditions {
		typ := string(c.Type)
		if mine[typ] && !mixed[typ] && nodecond.Owned(c) && !expected(expect, typ) && !slices.Contains(out, typ) {
			out = append(out, typ)
		}
	}
	return out
}

// entry is one of the Node's conditions and its place in the list.
type conditionEntry struct {
	index int
	c     corev1.NodeCondition
}

// extras are the entries of n's conditions plugd removes one by one: a
// status PUT (anyone's) may keep several entries of one type, and a
// strategic merge patch updates only the first, so a second entry of
// plugd's would keep saying what plugd said before, True while the plugin
// is gone. They are, of the types plugd's managedFields say it set, the
// entries in plugd's form (as unexpected: never another's) after the
// first of a type plugd expects, and every one of a type it no longer
// expects that has entries of others too (deleting the type would take
// those).
func extras(n *corev1.Node, expect []Expectation) []conditionEntry {
	var out []conditionEntry
	mine, mixed := nodecond.ManagedTypes(n, fieldManager), mixedTypes(n)
	seen := map[string]bool{}
	for i, c := range n.Status.Conditions {
		typ := string(c.Type)
		first := !seen[typ]
		seen[typ] = true
		if !mine[typ] || !nodecond.Owned(c) {
			continue
		}
		if exp := expected(expect, typ); exp && !first || !exp && mixed[typ] {
			out = append(out, conditionEntry{i, c})
		}
	}
	return out
}

// mixedTypes are the condition types of n with entries in plugd's form and
// entries in another.
func mixedTypes(n *corev1.Node) map[string]bool {
	owned, other := map[string]bool{}, map[string]bool{}
	for _, c := range n.Status.Conditions {
		if nodecond.Owned(c) {
			owned[string(c.Type)] = true
		} else {
			other[string(c.Type)] = true
		}
	}
	out := map[string]bool{}
	for typ := range owned {
		if other[typ] {
			out[typ] = true
		}
	}
	return out
}

func expected(expect []Expectation, typ string) bool {
	return slices.ContainsFunc(expect, func(e Expectation) bool { return e.Condition == typ })
}

// removalPatch is the JSON patch of the Node's status that removes the
// entries es, last first so that each index holds until it is removed,
// each after a test that the entry is still the one plugd saw there
// (what the informer keeps of it: a cut reason or message is not tested):
// a list changed since fails the patch instead of removing another's.
func removalPatch(es []conditionEntry) ([]byte, error) {
	es = slices.Clone(es)
	slices.SortFunc(es, func(a, b conditionEntry) int { return b.index - a.index })
	var ops []map[string]any
	for _, e := range es {
		at := fmt.Sprintf("/status/conditions/%d", e.index)
		ops = append(ops, map[string]any{"op": "test", "path": at + "/type", "value": e.c.Type},
			map[string]any{"op": "test", "path": at + "/status", "value": e.c.Status})
		if e.c.Reason != "" && len(e.c.Reason) < maxKeptReason {
			ops = append(ops, map[string]any{"op": "test", "path": at + "/reason", "value": e.c.Reason})
		}
		if e.c.Message != "" && len(e.c.Message) < maxKeptMessage-utf8.UTFMax {
			ops = append(ops, map[string]any{"op": "test", "path": at + "/message", "value": e.c.Message})
		}
		ops = append(ops, map[string]any{"op": "remove", "path": at})
	}
	return json.Marshal(ops)
}

// nodeCondition is v as the Node condition of type typ, given the one the
// Node has now (nil if none): its transition time moves only when its
// status does.
func nodeCondition(typ string, v conditionVerdict, cur *corev1.NodeCondition, now time.Time) corev1.NodeCondition {
	c := corev1.NodeCondition{
		Type: corev1.NodeConditionType(typ), Status: v.status, Reason: v.reason, Message: v.message,
		LastHeartbeatTime: metav1.NewTime(now), LastTransitionTime: metav1.NewTime(now),
	}
	if cur != nil && cur.Status == v.status {
		c.LastTransitionTime = cur.LastTransitionTime
	}
	return c
}

// findCondition returns the Node's condition of type typ, or nil.
func findCondition(n *corev1.Node, typ string) *corev1.NodeCondition {
	if n == nil {
		return nil
	}
	for i := range n.Status.Conditions {
		if string(n.Status.Conditions[i].Type) == typ {
			return &n.Status.Conditions[i]
		}
	}
	return nil
}

// sameVerdict says the Node's condition already says v.
func sameVerdict(c *corev1.NodeCondition, v conditionVerdict) bool {
	return c != nil && c.Status == v.status && c.Reason == v.reason && c.Message == v.message
}

// taintPatch is the JSON patch that removes the taint key:effect from n, and
// nothing else: it tests that the taint is still at the index it removes,
// so that a concurrent change of the list fails it instead of removing
// another taint. ok is false when n has no such taint.
func taintPatch(n *corev1.Node, key string, effect corev1.TaintEffect) (patch []byte, ok bool, err error) {
	for i, t := range n.Spec.Taints {
		if t.Key == key && t.Effect == effect {
			path := fmt.Sprintf("/spec/taints/%d", i)
			patch, err = json.Marshal([]map[string]any{
				{"op": "test", "path": path, "value": t},
				{"op": "remove", "path": path},
			})
			return patch, true, err
		}
	}
	return nil, false, nil
}
