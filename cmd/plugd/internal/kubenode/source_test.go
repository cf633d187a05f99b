package kubenode

import (
	"context"
	"fmt"
	goruntime "runtime"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"

	"github.com/plugd/plugd/internal/testenv"
)

// The informers keep of each object what plugd reads, however large the
// object the API server sends: a ResourceSlice with its pool and its
// devices' names and taints, without their attributes, a
// CSINode without its drivers' topology and allocatable, a Node with its
// conditions' reasons and messages cut.
func TestInformersKeepWhatPlugdReads(t *testing.T) {
	huge := strings.Repeat("é", 1<<19) // 1 MiB
	b := newBench(t,
		corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady"},
		corev1.NodeCondition{Type: "example.com/Huge", Status: corev1.ConditionTrue, Reason: huge, Message: huge},
		corev1.NodeCondition{Type: csiCond, Status: corev1.ConditionTrue, Reason: huge, Message: huge},
	)
	ctx := context.Background()
	devices := make([]resourcev1.Device, 128)
	for i := range devices {
		devices[i] = resourcev1.Device{Name: fmt.Sprintf("gpu-%d", i), Attributes: map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{
			"model": {StringValue: new(string)}}, ConsumesCounters: []resourcev1.DeviceCounterConsumption{{CounterSet: "set"}},
			Taints: []resourcev1.DeviceTaint{{Key: "example.com/xid", Value: strings.Repeat("v", 63), Effect: resourcev1.DeviceTaintEffectNoSchedule, TimeAdded: &metav1.Time{}}}}
	}
	for i := range 50 {
		s := &resourcev1.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("slice-%d", i)},
			Spec: resourcev1.ResourceSliceSpec{Driver: "gpu.example.com", NodeName: new("node-a"), Pool: resourcev1.ResourcePool{Name: "pool", Generation: 3, ResourceSliceCount: 50}, Devices: devices}}
		if _, err := b.cs.ResourceV1().ResourceSlices().Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	limit := int32(4)
	topo := &storagev1.CSINode{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}, Spec: storagev1.CSINodeSpec{Drivers: []storagev1.CSINodeDriver{
		{Name: "csi.example.com", NodeID: "node-a", TopologyKeys: []string{strings.Repeat("k", 1000)}, Allocatable: &storagev1.VolumeNodeResources{Count: &limit}}}}}
	seen := b.n.csiEvents.Load()
	if _, err := b.cs.StorageV1().CSINodes().Update(ctx, topo, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	b.waitFor("the informers delivering the slices and the CSINode", func() bool {
		return len(b.n.snapshot().slices) == 50 && b.n.csiEvents.Load() > seen
	})
	s := b.n.snapshot()
	want := resourcev1.Device{Name: "gpu-7", Taints: []resourcev1.DeviceTaint{{Key: "example.com/xid", Effect: resourcev1.DeviceTaintEffectNoSchedule}}}
	for _, sl := range s.slices {
		p := sl.Spec.Pool
		if len(sl.Spec.Devices) != 128 || sl.Spec.Driver != "gpu.example.com" || p.Name != "pool" || p.Generation != 3 || p.ResourceSliceCount != 50 {
			t.Fatalf("the informer keeps a slice with %d devices, of driver %q, pool %+v", len(sl.Spec.Devices), sl.Spec.Driver, p)
		}
		if d := sl.Spec.Devices[7]; !equality.Semantic.DeepEqual(d, want) {
			t.Fatalf("the informer keeps the device %+v; want %+v", d, want)
		}
	}
	// Its attach limit stays: a CSI driver that reports one is ready only
	// once CSINode has it (issue 32).
	if d := s.csiNode.Spec.Drivers[0]; d.NodeID != "node-a" || d.TopologyKeys != nil || d.Allocatable == nil || d.Allocatable.Count == nil || *d.Allocatable.Count != limit {
		t.Errorf("the informer keeps the CSINode driver %+v", d)
	}
	var types []string
	for _, c := range s.node.Status.Conditions {
		types = append(types, string(c.Type))
		if len(c.Message) > maxKeptMessage || len(c.Reason) > maxKeptReason || !strings.HasPrefix(huge, c.Message) {
			t.Errorf("the informer keeps condition %s with a reason of %d bytes and a message of %d", c.Type, len(c.Reason), len(c.Message))
		}
	}
	if strings.Join(types, " ") != "Ready example.com/Huge "+csiCond {
		t.Errorf("the informer keeps the conditions %v; want every one, in its place", types)
	}
}

// maxSliceHeap bounds what the informer keeps of 3,000 ResourceSlices of
// 32 devices of 4 attributes each for this node (26 MB as JSON): their
// names and taints take 21 MB; with their attributes, 175 MB.
const maxSliceHeap = 32 << 20

// What the informer keeps of ResourceSlices stays bounded: each device's
// name and taints, its attributes only for a driver whose devices are
// matched against DeviceClasses.
func TestSliceMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("builds 3,000 slices")
	}
	measure := func(matched func(string) bool) float64 {
		var ms goruntime.MemStats
		goruntime.GC()
		goruntime.ReadMemStats(&ms)
		base := ms.HeapAlloc
		kept := make([]any, 3000)
		slim := slimSlice(matched)
		for i := range kept {
			kept[i], _ = slim(largeSlice(i))
		}
		goruntime.GC()
		goruntime.ReadMemStats(&ms)
		goruntime.KeepAlive(kept)
		return float64(ms.HeapAlloc) - float64(base)
	}
	slim := measure(func(string) bool { return false })
	t.Logf("3,000 slices kept: %.1f MB", slim/1e6)
	if slim > maxSliceHeap {
		t.Errorf("3,000 slices kept take %.1f MB; want at most %d MB", slim/1e6, maxSliceHeap>>20)
	}
	if testing.Verbose() {
		t.Logf("with their attributes: %.1f MB", measure(func(string) bool { return true })/1e6)
	}
}

// largeSlice is slice i of a pool of 3,000, of 32 devices of 4 attributes
// (8.8 KB of JSON), each string its own, as decoding makes them.
func largeSlice(i int) *resourcev1.ResourceSlice {
	devices := make([]resourcev1.Device, 32)
	for d := range devices {
		attr := func(s string) resourcev1.DeviceAttribute { return resourcev1.DeviceAttribute{StringValue: &s} }
		devices[d] = resourcev1.Device{Name: fmt.Sprintf("gpu-%d-%d", i, d), Attributes: map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{
			"model":     attr(fmt.Sprintf("an-accelerator-of-the-large-kind-%d", d)),
			"driverVer": attr(fmt.Sprintf("1.2.3-build-4567890-with-a-long-suffix-%d", d)),
			"uuid":      attr(fmt.Sprintf("GPU-%08d-%04d-aaaa-bbbb-cccccccccccc", i, d)),
			"pciBusID":  attr(fmt.Sprintf("0000:%02x:%02x.0-some-more-text", i%256, d)),
		}}
	}
	return &resourcev1.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("node-a-pool-%d", i)},
		Spec: resourcev1.ResourceSliceSpec{Driver: "gpu.example.com", NodeName: new("node-a"),
			Pool: resourcev1.ResourcePool{Name: "pool", Generation: 1, ResourceSliceCount: 3000}, Devices: devices}}
}

// Issue 34: DeviceClasses are read only when an expectation names some;
// the informer keeps a class's name, UID, resourceVersion and selectors,
// not its configuration for drivers; a change asks for an evaluation; one
// class named is watched by its name.
func TestDeviceClassesRead(t *testing.T) {
	if b := newBench(t); b.n.classes != nil || b.n.snapshot().classes != nil {
		t.Fatal("plugd reads DeviceClasses though no expectation names one")
	}
	names := func(cfg *Config) {
		cfg.Expect = append(cfg.Expect,
			Expectation{Type: TypeDRA, Name: "gpu.example.com", DeviceClasses: []string{"gpu.example.com"}},
			// An alternative's classes are read too.
			Expectation{Type: TypeAnyOf, Name: "nic.example.com", AnyOf: []Expectation{
				{Type: TypeDRA, Name: "nic.example.com", DeviceClasses: []string{"gpu.example.com", "fast.gpu.example.com"}}}})
	}
	b := newBenchWith(t, names, &corev1.Node{})
	if len(b.n.sources()) != 4 || b.n.classes.op != "list and watch DeviceClasses" {
		t.Fatalf("the DeviceClass informer: %d sources, %+v", len(b.n.sources()), b.n.classes)
	}
	ctx := t.Context()
	select {
	case <-b.n.kick: // the sync's
	default:
	}
	opaque := runtime.RawExtension{Raw: []byte(`{"big":"` + strings.Repeat("x", 10000) + `"}`)}
	class := &resourcev1.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "gpu.example.com", UID: "uid-1", ResourceVersion: "7", Labels: map[string]string{"a": "b"}},
		Spec: resourcev1.DeviceClassSpec{
			Selectors: []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{Expression: `device.driver == "gpu.example.com"`}}},
			Config:    []resourcev1.DeviceClassConfiguration{{DeviceConfiguration: resourcev1.DeviceConfiguration{Opaque: &resourcev1.OpaqueDeviceConfiguration{Driver: "gpu.example.com", Parameters: opaque}}}}}}
	if _, err := b.cs.ResourceV1().DeviceClasses().Create(ctx, class, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	b.waitFor("the class", func() bool { return b.n.snapshot().classes["gpu.example.com"] != nil })
	s := b.n.snapshot()
	got := s.classes["gpu.example.com"]
	if got.UID != "uid-1" || got.ResourceVersion != "7" || len(got.Spec.Selectors) != 1 || got.Spec.Selectors[0].CEL.Expression != class.Spec.Selectors[0].CEL.Expression ||
		got.Spec.Config != nil || got.Labels != nil {
		t.Errorf("the informer keeps %+v", got)
	}
	if _, ok := s.classes["fast.gpu.example.com"]; ok || s.classProblem != nil {
		t.Errorf("a class that does not exist: %v, trouble %+v", s.classes, s.classProblem)
	}
	select {
	case <-b.n.kick:
	case <-time.After(testenv.Timeout):
		t.Error("a new DeviceClass asked for no evaluation")
	}
	if err := b.cs.ResourceV1().DeviceClasses().Delete(ctx, "gpu.example.com", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	b.waitFor("the class gone", func() bool { return b.n.snapshot().classes["gpu.example.com"] == nil })

	// One class: watched by its name.
	var sel []string
	one := func(cfg *Config) {
		cfg.Expect = append(cfg.Expect, Expectation{Type: TypeDRA, Name: "gpu.example.com", DeviceClasses: []string{"gpu.example.com"}})
	}
	b = newBenchWith(t, one, &corev1.Node{})
	for _, a := range b.cs.Actions() {
		if a.GetResource().Resource == "deviceclasses" {
			if l, ok := a.(k8stesting.ListAction); ok {
				sel = append(sel, l.GetListRestrictions().Fields.String())
			}
		}
	}
	if b.n.classes.op != "list and watch DeviceClass gpu.example.com" || len(sel) == 0 || slices.ContainsFunc(sel, func(s string) bool { return s != "metadata.name=gpu.example.com" }) {
		t.Errorf("one class is read as %q with field selectors %q; want metadata.name=gpu.example.com", b.n.classes.op, sel)
	}
}
