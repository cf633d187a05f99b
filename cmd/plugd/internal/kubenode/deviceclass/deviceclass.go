// Package deviceclass says how many of a DRA driver's devices a DeviceClass
// selects, with the scheduler's own CEL environment and device conversion
// (k8s.io/dynamic-resource-allocation/cel), and what an expected DRA
// driver's Node condition says when a class it names is missing or selects
// too few of them.
//
// A Matcher is all it takes; its zero value is ready to use:
//
//	var m deviceclass.Matcher // one for the node agent's life: it keeps the compiled classes
//	...
//	for _, name := range e.DeviceClasses {
//		r := m.Check(ctx, name, classes[name], e.Name, usable, minDevices)
//		if r.Reason != "" {
//			return no(r.Reason, r.Message)
//		}
//	}
//
// where classes are the DeviceClasses the informer holds, by name (nil: no
// such class), and usable are the driver's devices on this node that count
// (in complete pools at their newest generation, untainted, healthy): the
// class is held to those alone.
package deviceclass

import (
	"context"
	"fmt"
	"sync"

	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/types"
	dracel "k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/utils/lru"

	"github.com/plugd/plugd/internal/textsafe"
)

// The reasons of an expected DRA driver's condition that a DeviceClass
// gives.
const (
	// ReasonMissing: no DeviceClass has the name the expectation gives.
	ReasonMissing = "DeviceClassMissing"
	// ReasonNoMatch: the class selects fewer of the driver's usable devices
	// than needed, or its selectors cannot be evaluated on them (a CEL
	// compile error, or a runtime error such as a missing attribute, which
	// fails the scheduler's allocations too).
	ReasonNoMatch = "NoMatchingDevices"
)

// features are the scheduler's CEL features as Kubernetes v1.37 sets them
// by default: DRAConsumableCapacity on (beta since 1.36),
// DRAListTypeAttributes off (alpha).
// A cluster that turns the alpha on may have classes plugd cannot compile:
// they show as ReasonNoMatch with the compile error, never as a match.
var features = dracel.Features{EnableConsumableCapacity: true}

// maxClasses bounds the compiled classes a Matcher keeps. A node expects a
// handful of classes; each edit of one is a new entry, and the oldest go
// first.
const maxClasses = 64

// maxErrorText bounds the CEL error quoted in a message: a condition's
// whole message is at most nodecond.MaxMessage.
const maxErrorText = 200

// Matcher evaluates DeviceClasses' selectors on devices. Each class is
// compiled once for each resourceVersion of it, compile errors included,
// and its last count is kept with the devices it was made of: the same
// class on the same devices is not evaluated again. A selector the API
// server stored may cost up to resourceapi.CELSelectorExpressionMaxCost
// per device (0.2 to 0.4 s of a core on a test machine: TestCount's cost
// limit case), so an unchanged class must cost nothing. At most maxClasses are kept, the least recently
// used dropped first. The zero Matcher is ready to use; it is safe for
// concurrent use.
type Matcher struct {
	once     sync.Once
	compiled *lru.Cache // classKey -> *compiledClass; safe for concurrent use
}

// classKey names one version of one DeviceClass.
type classKey struct {
	uid             types.UID
	resourceVersion string
}

// compiledClass is one version of a class, compiled, and its last count.
type compiledClass struct {
	sels []compiledSelector

	mu   sync.Mutex
	last *count // guarded by mu
}

// compiledSelector is one selector of a class: its program, or why it has
// none.
type compiledSelector struct {
	expr dracel.CompilationResult
	err  error
}

// count is a Count of a class on a driver's devices (a copy of them).
type count struct {
	driver  string
	devices []resourcev1.Device
	n       int
	err     error
}

// Count is how many of devices, the devices of the DRA driver named driver,
// every selector of class matches (a class with no selectors matches them
// all), as the scheduler evaluates them: the same CEL environment, cost
// limit (resourceapi.CELSelectorExpressionMaxCost per evaluation) and
// conversion of a device's attributes and capacity.
//
// err is a compile error, naming the selector (the class then matches
// nothing), or the first runtime error (a missing attribute, the cost
// limit), naming the selector and the device: the count stops there, as
// the scheduler's allocation does, and n is what matched before it.
// Evaluation stops, with ctx's error, once ctx is done. Count never panics
// on what the API holds; it is safe for concurrent use and does not keep
// devices, which it copies.
func (m *Matcher) Count(ctx context.Context, class *resourcev1.DeviceClass, driver string, devices []resourcev1.Device) (int, error) {
	c := m.compile(class)
	for _, s := range c.sels {
		if s.err != nil {
			return 0, s.err
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if l := c.last; l != nil && l.driver == driver && equality.Semantic.DeepEqual(l.devices, devices) {
		return l.n, l.err
	}
	var n int
	var err error
	for i := range devices {
		var ok bool
		ok, err = matches(ctx, c.sels, driver, &devices[i])
		if ctxErr := context.Cause(ctx); ctxErr != nil {
			return n, fmt.Errorf("evaluation stopped: %w", ctxErr)
		}
		if err != nil {
			break
		}
		if ok {
			n++
		}
	}
	copied := make([]resourcev1.Device, len(devices))
	for i := range devices {
		devices[i].DeepCopyInto(&copied[i])
	}
	c.last = &count{driver, copied, n, err}
	return n, err
}

// matches says whether every selector matches device d.
func matches(ctx context.Context, sels []compiledSelector, driver string, d *resourcev1.Device) (bool, error) {
	in := dracel.Device{Driver: driver, AllowMultipleAllocations: d.AllowMultipleAllocations, Attributes: d.Attributes, Capacity: d.Capacity}
	for i, s := range sels {
		ok, _, err := s.expr.DeviceMatches(ctx, in)
		if err != nil {
			return false, fmt.Errorf("selector #%d on device %s: CEL runtime error: %w", i, d.Name, dracel.EnhanceRuntimeError(err))
		}
		if !ok {
			return false, nil
		}
	}
	return true, nil
}

// compile is class compiled, from the cache when this version of it was
// compiled before.
func (m *Matcher) compile(class *resourcev1.DeviceClass) *compiledClass {
	m.once.Do(func() { m.compiled = lru.New(maxClasses) })
	k := classKey{class.UID, class.ResourceVersion}
	if k.uid != "" { // an object the API server stored; a bare one is compiled each time
		if v, ok := m.compiled.Get(k); ok {
			return v.(*compiledClass)
		}
	}
	compiler := dracel.GetCompiler(features)
	out := &compiledClass{sels: make([]compiledSelector, len(class.Spec.Selectors))}
	for i, sel := range class.Spec.Selectors {
		if sel.CEL == nil {
			out.sels[i].err = fmt.Errorf("selector #%d is not a CEL selector: plugd knows no other kind", i)
			continue
		}
		// As the scheduler's cel.Cache compiles a selector: no cost
		// estimate (the API server made one when it stored the class),
		// the runtime cost limit bounds each evaluation.
		out.sels[i].expr = compiler.CompileCELExpression(sel.CEL.Expression, dracel.Options{DisableCostEstimation: true})
		if err := out.sels[i].expr.Error; err != nil {
			out.sels[i].err = fmt.Errorf("selector #%d: CEL compile error: %w", i, err)
		}
	}
	if k.uid != "" {
		m.compiled.Add(k, out)
	}
	return out
}

// Result is what one DeviceClass an expectation names makes of the driver's
// usable devices.
type Result struct {
	// Matched is how many of them the class selects (before the first
	// runtime error, when there is one).
	Matched int
	// Reason is ReasonMissing or ReasonNoMatch, or empty when the class
	// selects enough of them.
	Reason string
	// Message says so, naming the class and the count (and the CEL error,
	// cut to a few hundred bytes); it holds nothing that changes while the
	// class, the devices and the verdict stay as they are.
	Message string
}

// Check is what the DeviceClass named name makes of devices, the usable
// devices of the DRA driver named driver, when minDevices of them are
// needed: class is the DeviceClass of that name, nil when there is none.
// It is Count, judged; an error of ctx (plugd stopping) is returned as err
// and is no verdict on the class.
func (m *Matcher) Check(ctx context.Context, name string, class *resourcev1.DeviceClass, driver string, devices []resourcev1.Device, minDevices int) (Result, error) {
	if class == nil {
		return Result{Reason: ReasonMissing, Message: fmt.Sprintf("DeviceClass %s does not exist", name)}, nil
	}
	n, err := m.Count(ctx, class, driver, devices)
	if ctx.Err() != nil {
		return Result{}, err
	}
	r := Result{Matched: n, Message: fmt.Sprintf("DeviceClass %s selects %d of the driver's %d usable devices", name, n, len(devices))}
	switch {
	case err != nil:
		// The scheduler fails an allocation at the first error it meets,
		// whatever matched before it.
		r.Reason = ReasonNoMatch
		r.Message = fmt.Sprintf("DeviceClass %s cannot select the driver's devices: %s", name, textsafe.Shorten(err.Error(), maxErrorText))
	case n < minDevices:
		r.Reason = ReasonNoMatch
		r.Message += fmt.Sprintf(", %d needed", minDevices)
	}
	return r, nil
}
