package kubenode

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
		var ms runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&ms)
		base := ms.HeapAlloc
		kept := make([]any, 3000)
		slim := slimSlice(matched)
		for i := range kept {
			kept[i], _ = slim(largeSlice(i))
		}
		runtime.GC()
		runtime.ReadMemStats(&ms)
		runtime.KeepAlive(kept)
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
