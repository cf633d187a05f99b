package kubenode

import (
	"context"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The informers keep of each object what plugd reads, however large the
// object the API server sends: a ResourceSlice without its devices, a
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
			"model": {StringValue: new(string)}}}
	}
	for i := range 50 {
		s := &resourcev1.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("slice-%d", i)},
			Spec: resourcev1.ResourceSliceSpec{Driver: "gpu.example.com", NodeName: new("node-a"), Pool: resourcev1.ResourcePool{Name: "pool", ResourceSliceCount: 50}, Devices: devices}}
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
	for _, sl := range s.slices {
		if len(sl.Spec.Devices) > 0 || sl.Spec.Driver != "gpu.example.com" {
			t.Fatalf("the informer keeps a slice with %d devices, of driver %q", len(sl.Spec.Devices), sl.Spec.Driver)
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
