package kubenode

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	"github.com/plugd/plugd/internal/nodecond"
)

// Problem is trouble plugd has with the API server: a read or a write of
// this node's objects that fails. It lasts until the same operation
// succeeds.
type Problem struct {
	// Operation is what failed, e.g. "list and watch CSINode node-a" or
	// "patch nodes/status of node-a".
	Operation string
	// Reason is ReasonAPIUnavailable, ReasonForbidden, ReasonUnauthorized,
	// ReasonNotServed or ReasonNotSynced.
	Reason string
	// Message says what happened and what to do.
	Message string
	// Permission is, for ReasonForbidden, the permission plugd lacks, as
	// RBAC writes it ("list, watch csinodes.storage.k8s.io").
	Permission string
	Since      time.Time
}

// The reasons of a Problem. They are also the reasons of a kubelet view
// that is Unknown because of it.
const (
	ReasonAPIUnavailable = "APIUnavailable" // unreachable, timing out, or overloaded
	ReasonForbidden      = "Forbidden"      // RBAC refuses plugd
	ReasonUnauthorized   = "Unauthorized"   // the credentials are not accepted
	ReasonNotServed      = "NotServed"      // the API server does not serve the resource
	ReasonNotSynced      = "NotSynced"      // not read yet since plugd started
	// ReasonRefusedByPolicy: an admission policy (the chart's, that
	// confines plugd to its own Node) refuses the write.
	ReasonRefusedByPolicy = "RefusedByPolicy"
)

// classify is the reason and a message for err, from an operation that
// needs permission perm.
func classify(op, perm string, err error, since time.Time) *Problem {
	p := &Problem{Operation: op, Since: since}
	msg := err.Error()
	switch {
	case strings.Contains(msg, "ValidatingAdmissionPolicy") && (apierrors.IsInvalid(err) || apierrors.IsForbidden(err)):
		p.Reason = ReasonRefusedByPolicy
		p.Message = fmt.Sprintf("cannot %s: an admission policy refuses it (are plugd's condition types and taint the ones its parameters list, and does plugd's token carry its node name? docs/security.md): %s", op, msg)
	case apierrors.IsForbidden(err):
		p.Reason, p.Permission = ReasonForbidden, perm
		p.Message = fmt.Sprintf("cannot %s: plugd lacks the permission %q (the ClusterRole plugd in deploy/kubernetes grants it; is it bound to plugd's ServiceAccount?): %s", op, perm, msg)
	case apierrors.IsUnauthorized(err):
		p.Reason = ReasonUnauthorized
		p.Message = fmt.Sprintf("cannot %s: the API server does not accept plugd's credentials (an expired or revoked token, a wrong kubeconfig?): %s", op, msg)
	case apierrors.IsNotFound(err) && strings.Contains(op, "list"):
		p.Reason = ReasonNotServed
		p.Message = fmt.Sprintf("cannot %s: the API server does not serve it (an older Kubernetes, or the API group disabled): %s", op, msg)
	default:
		p.Reason = ReasonAPIUnavailable
		p.Message = fmt.Sprintf("cannot %s: %s; plugd retries with backoff", op, msg)
	}
	return p
}

// source is one informer of this node's objects, and whether its reads
// work: every list and watch it makes is recorded, so that trouble shows
// at once and its end as soon as a read succeeds, with no request of its
// own.
type source struct {
	op, perm string
	inf      cache.SharedIndexInformer
	log      *slog.Logger
	onChange func() // called, outside mu, when the problem changes

	mu      sync.Mutex
	problem *Problem // nil while reads work; guarded by mu
}

// newSource builds the informer of the objects list and watch return (what
// names them, such as "CSINode node-a"), with the field selector sel applied
// to every request; it keeps each object as slim makes it. client is the
// clientset behind them, which may say it cannot stream a watch's initial
// list (a fake one in tests).
func newSource(what, perm, sel string, example runtime.Object, slim cache.TransformFunc, client any, log *slog.Logger,
	list func(context.Context, metav1.ListOptions) (runtime.Object, error),
	watchFn func(context.Context, metav1.ListOptions) (watch.Interface, error)) *source {
	s := &source{op: "list and watch " + what, perm: perm, log: log}
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = sel
			// client-go bounds watches, not lists: an API server that
			// takes the request and never answers would leave the
			// source unsynced, and no problem said.
			lctx, cancel := context.WithTimeout(ctx, listTimeout)
			defer cancel()
			obj, err := list(lctx, o)
			s.record(ctx, err)
			return obj, err
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = sel
			w, err := watchFn(ctx, o)
			s.record(ctx, err)
			return w, err
		},
	}
	s.inf = cache.NewSharedIndexInformerWithOptions(cache.ToListWatcherWithWatchListSemantics(lw, client), example, cache.SharedIndexInformerOptions{ObjectDescription: what})
	_ = s.inf.SetTransform(slim) // it fails only once started
	// The reflector retries with backoff; its own handler would log every
	// failure, where plugd logs each change of state once.
	_ = s.inf.SetWatchErrorHandlerWithContext(func(ctx context.Context, _ *cache.Reflector, err error) {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
			return // a watch that ended, or must start again from a new list
		}
		s.record(ctx, err)
	})
	return s
}

// record notes the outcome of one request.
func (s *source) record(ctx context.Context, err error) {
	if ctx.Err() != nil {
		return // shutting down
	}
	s.mu.Lock()
	was := s.problem
	switch {
	case err == nil && was == nil:
		s.mu.Unlock()
		return
	case err == nil:
		s.problem = nil
	default:
		p := classify(s.op, s.perm, err, time.Now())
		if was != nil && was.Reason == p.Reason {
			p.Since = was.Since
		}
		s.problem = p
	}
	now := s.problem
	s.mu.Unlock()
	switch {
	case now == nil:
		s.log.Info("Kubernetes API: reading again", "operation", s.op, "troubleSince", was.Since)
	case was == nil || was.Reason != now.Reason:
		s.log.Warn("Kubernetes API: cannot read; the plugins' kubelet view is Unknown until it can", "operation", s.op, "reason", now.Reason, "err", now.Message)
	}
	if s.onChange != nil && (now == nil || was == nil || was.Reason != now.Reason) {
		s.onChange()
	}
}

// trouble is the source's problem, or NotSynced before its first list.
func (s *source) trouble() *Problem {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.problem != nil {
		p := *s.problem
		return &p
	}
	if !s.inf.HasSynced() {
		return &Problem{Operation: s.op, Reason: ReasonNotSynced, Message: fmt.Sprintf("plugd has not yet read %s from the API server", strings.TrimPrefix(s.op, "list and watch "))}
	}
	return nil
}

// The informers keep of each object only what plugd reads: a Node's
// images, a ResourceSlice's devices and a CSINode's topology are most of
// them, and anyone who may write them can make them large (3,000
// ResourceSlices of 7.9 KB kept whole took plugd from 58 to 220 MB).

// Bounds of what the Node's informer keeps of a condition: the API
// validates neither its reason nor its message. plugd's own are shorter
// (nodecond.MaxMessage), so a cut one is never taken for plugd's verdict.
const (
	maxKeptReason  = 128
	maxKeptMessage = 1024
	// maxKeptVersion bounds the kubelet's version as the Node reports it
	// ("v1.37.2", or a distribution's "v1.37.2+k3s1").
	maxKeptVersion = 64
)

// slimNode keeps of a Node what plugd reads: its name and UID (events
// refer to it), labels (the topology a CSI driver reports is held against
// them), plugd's own managedFields and who last wrote its taints, its
// taints, capacity, allocatable, the kubelet's version (by which the
// doctor judges what the kubelet asks of DRA drivers) and conditions,
// every one in its place (plugd removes its duplicates by index), their
// reasons and messages cut to maxKeptReason and maxKeptMessage.
func slimNode(obj any) (any, error) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil
	}
	out := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name, UID: n.UID, ResourceVersion: n.ResourceVersion, Labels: n.Labels},
		Spec: corev1.NodeSpec{Taints: n.Spec.Taints},
		Status: corev1.NodeStatus{Capacity: n.Status.Capacity, Allocatable: n.Status.Allocatable,
			NodeInfo: corev1.NodeSystemInfo{KubeletVersion: cutText(n.Status.NodeInfo.KubeletVersion, maxKeptVersion)}}}
	for _, mf := range n.ManagedFields {
		switch {
		case mf.Manager == nodecond.FieldManager:
			out.ManagedFields = append(out.ManagedFields, mf)
		case mf.Subresource == "" && mf.FieldsV1 != nil && ownsTaints(mf.FieldsV1.Raw):
			// Who last wrote the taints, and when (taintsOwner), not the fields.
			out.ManagedFields = append(out.ManagedFields, metav1.ManagedFieldsEntry{Manager: mf.Manager,
				Operation: mf.Operation, Time: mf.Time, FieldsType: mf.FieldsType, FieldsV1: taintsOwnerFields})
		}
	}
	out.Status.Conditions = make([]corev1.NodeCondition, len(n.Status.Conditions))
	for i, c := range n.Status.Conditions {
		c.Reason, c.Message = cutText(c.Reason, maxKeptReason), cutText(c.Message, maxKeptMessage)
		out.Status.Conditions[i] = c
	}
	return out, nil
}

// cutText is s cut to at most n bytes, at the start of a character.
func cutText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// slimCSINode keeps the name, node ID and attach limit (allocatable) of
// each of a CSINode's drivers.
func slimCSINode(obj any) (any, error) {
	c, ok := obj.(*storagev1.CSINode)
	if !ok {
		return obj, nil
	}
	out := &storagev1.CSINode{ObjectMeta: metav1.ObjectMeta{Name: c.Name, UID: c.UID, ResourceVersion: c.ResourceVersion},
		Spec: storagev1.CSINodeSpec{Drivers: make([]storagev1.CSINodeDriver, len(c.Spec.Drivers))}}
	for i, d := range c.Spec.Drivers {
		out.Spec.Drivers[i] = storagev1.CSINodeDriver{Name: d.Name, NodeID: d.NodeID, Allocatable: d.Allocatable}
	}
	return out, nil
}

// slimSlice keeps of a ResourceSlice what the DRA layers read (dra.go):
// its driver, node and pool (name, generation, slice count), and of each
// device its name and its taints (key and effect); of the devices of the
// drivers in matched, their attributes and capacity too, which a
// DeviceClass's selectors match. The rest (counters, binding conditions,
// per-device node selection, the taints' values and times) is dropped.
// Only this node's slices are listed, and the API bounds each (128
// devices, 32 attributes and capacities each); still, 3,000 slices of
// 32 devices of 4 attributes take 175 MB with their attributes, 21 MB
// without (TestSliceMemory): attributes are kept only where a class is
// matched.
func slimSlice(matched func(driver string) bool) cache.TransformFunc {
	return func(obj any) (any, error) {
		s, ok := obj.(*resourcev1.ResourceSlice)
		if !ok {
			return obj, nil
		}
		out := &resourcev1.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: s.Name, UID: s.UID, ResourceVersion: s.ResourceVersion},
			Spec: resourcev1.ResourceSliceSpec{Driver: s.Spec.Driver, NodeName: s.Spec.NodeName,
				Pool: resourcev1.ResourcePool{Name: s.Spec.Pool.Name, Generation: s.Spec.Pool.Generation, ResourceSliceCount: s.Spec.Pool.ResourceSliceCount}}}
		if len(s.Spec.Devices) > 0 {
			out.Spec.Devices = make([]resourcev1.Device, len(s.Spec.Devices))
		}
		attrs := matched(s.Spec.Driver)
		for i, d := range s.Spec.Devices {
			kept := resourcev1.Device{Name: d.Name}
			if attrs {
				kept.Attributes, kept.Capacity = d.Attributes, d.Capacity
			}
			for _, t := range d.Taints {
				kept.Taints = append(kept.Taints, resourcev1.DeviceTaint{Key: t.Key, Effect: t.Effect})
			}
			out.Spec.Devices[i] = kept
		}
		return out, nil
	}
}

// classesMatched says which DRA drivers' devices are matched against
// DeviceClasses (an expectation, or an anyOf alternative, that names
// deviceClasses), whose attributes and capacity the informer keeps.
func classesMatched(expect []Expectation) func(driver string) bool {
	drivers := classNames(expect)
	return func(driver string) bool { return drivers[driver] != nil }
}

// slimDeviceClass keeps a DeviceClass's name, UID and resourceVersion (its
// compiled selectors are cached by the last two: deviceclass.Matcher) and
// its selectors: not its configuration for drivers (opaque parameters, up
// to 10 KiB each), which plugd does not read.
func slimDeviceClass(obj any) (any, error) {
	c, ok := obj.(*resourcev1.DeviceClass)
	if !ok {
		return obj, nil
	}
	return &resourcev1.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: c.Name, UID: c.UID, ResourceVersion: c.ResourceVersion},
		Spec: resourcev1.DeviceClassSpec{Selectors: c.Spec.Selectors}}, nil
}
