package kubenode

import (
	"context"
	"encoding/json"
	"slices"
	"time"

	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	"github.com/plugd/plugd/internal/backoff"
)

// DeviceTaintRules (resource.k8s.io/v1, GA and served by default from
// Kubernetes v1.37; v1beta2 behind a feature gate before) taint devices
// as a taint in their slice does. They are cluster-scoped and select
// devices by driver, pool and device name, none of which a field
// selector narrows: plugd watches them all (they are few, an
// administrator's), and only where the API server serves them at v1,
// which one discovery request tells when Run starts.

// The states of the DeviceTaintRules' discovery.
const (
	rulesUnknown   int32 = iota // not asked yet, or no answer
	rulesNotServed              // the API server does not serve them at v1
	rulesServed                 // watched
)

// buildTaintRules makes the DeviceTaintRules' informer; Run starts it
// once discovery says they are served.
func (n *Node) buildTaintRules() {
	rules := n.resource.DeviceTaintRules()
	n.taintRules = newSource("DeviceTaintRules", "list, watch devicetaintrules.resource.k8s.io", "", &resourcev1.DeviceTaintRule{}, slimTaintRule, n.fakeAPI, n.log,
		func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return rules.List(ctx, o) },
		func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) { return rules.Watch(ctx, o) })
	n.taintRules.onChange = n.changed
	count := func() { n.sliceEvents.Add(1); n.changed() } // the views are made again
	_, _ = n.taintRules.inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { count() }, UpdateFunc: func(any, any) { count() }, DeleteFunc: func(any) { count() }})
	if n.discoverRules == nil {
		n.discoverRules = n.rulesServedByAPI
	}
}

// rulesServedByAPI asks the API server's discovery whether it serves
// devicetaintrules at resource.k8s.io/v1.
func (n *Node) rulesServedByAPI(ctx context.Context) (bool, error) {
	if n.fakeAPI != nil {
		return true, nil // a fake clientset serves every resource, and no discovery
	}
	ctx, cancel := context.WithTimeout(ctx, listTimeout)
	defer cancel()
	// JSON: the client asks for protobuf first, which discovery answers too.
	raw, err := n.resource.RESTClient().Get().AbsPath("/apis/resource.k8s.io/v1").SetHeader("Accept", "application/json").DoRaw(ctx)
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	var list metav1.APIResourceList
	if err := json.Unmarshal(raw, &list); err != nil {
		return false, err
	}
	return slices.ContainsFunc(list.APIResources, func(r metav1.APIResource) bool { return r.Name == "devicetaintrules" }), nil
}

// runTaintRules asks discovery until it answers, and watches the
// DeviceTaintRules if they are served, until ctx is done.
func (n *Node) runTaintRules(ctx context.Context) {
	b := backoff.New(writeBackoffMin, writeBackoffMax, writeJitter)
	for {
		served, err := n.discoverRules(ctx)
		if err == nil {
			state := rulesNotServed
			if served {
				state = rulesServed
			}
			n.rules.Store(state)
			n.log.Info("Kubernetes: DeviceTaintRules", "watched", served)
			n.sliceEvents.Add(1)
			n.changed()
			if served {
				n.taintRules.inf.RunWithContext(ctx)
			}
			return
		}
		n.log.Warn("Kubernetes: cannot ask whether DeviceTaintRules are served; DRA drivers' devices are not judged until it can; retrying", "err", err)
		t := n.clock.NewTimer(b.Next())
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C():
		}
	}
}

// taintRulesNow are the taints of the DeviceTaintRules, and the trouble
// of reading them (NotSynced until discovery has answered).
func (n *Node) taintRulesNow() ([]deviceTaint, *Problem) {
	switch n.rules.Load() {
	case rulesNotServed:
		return nil, nil
	case rulesUnknown:
		return nil, &Problem{Operation: n.taintRules.op, Reason: ReasonNotSynced, Message: "plugd has not yet asked the API server whether it serves DeviceTaintRules", Since: time.Time{}}
	}
	if p := n.taintRules.trouble(); p != nil {
		return nil, p
	}
	var out []deviceTaint
	for _, obj := range n.taintRules.inf.GetStore().List() {
		if r, ok := obj.(*resourcev1.DeviceTaintRule); ok {
			if t, ok := taintOfRule(r); ok {
				out = append(out, t)
			}
		}
	}
	return out, nil
}

// taintOfRule is the taint a DeviceTaintRule puts, and on what; ok is
// false for a rule without a selector, which selects nothing.
func taintOfRule(r *resourcev1.DeviceTaintRule) (deviceTaint, bool) {
	sel := r.Spec.DeviceSelector
	if sel == nil {
		return deviceTaint{}, false
	}
	return deviceTaint{key: r.Spec.Taint.Key, effect: r.Spec.Taint.Effect, driver: sel.Driver, pool: sel.Pool, device: sel.Device}, true
}

// slimTaintRule keeps a DeviceTaintRule's selector (driver, pool and
// device) and its taint's key and effect.
func slimTaintRule(obj any) (any, error) {
	r, ok := obj.(*resourcev1.DeviceTaintRule)
	if !ok {
		return obj, nil
	}
	out := &resourcev1.DeviceTaintRule{ObjectMeta: metav1.ObjectMeta{Name: r.Name, UID: r.UID, ResourceVersion: r.ResourceVersion},
		Spec: resourcev1.DeviceTaintRuleSpec{Taint: resourcev1.DeviceTaint{Key: r.Spec.Taint.Key, Effect: r.Spec.Taint.Effect}}}
	if sel := r.Spec.DeviceSelector; sel != nil {
		out.Spec.DeviceSelector = &resourcev1.DeviceTaintSelector{Driver: sel.Driver, Pool: sel.Pool, Device: sel.Device}
	}
	return out, nil
}
