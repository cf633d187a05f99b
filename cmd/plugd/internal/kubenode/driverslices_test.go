package kubenode

import (
	"context"
	"maps"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The doctor's facts of DRA drivers: this node's ResourceSlices counted by
// driver, as the informer holds them (slices of other nodes are not
// listed), and the kubelet's version the Node reports.
func TestDriverSlicesAndKubeletVersion(t *testing.T) {
	b := newBenchWith(t, nil, &corev1.Node{Status: corev1.NodeStatus{NodeInfo: corev1.NodeSystemInfo{KubeletVersion: "v1.36.3", OSImage: "not kept"}}})
	if v := b.n.Kubelet().Version; v != "v1.36.3" {
		t.Errorf("kubelet version %q, want v1.36.3", v)
	}
	slice := func(name, driver, node string) *resourcev1.ResourceSlice {
		return &resourcev1.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: resourcev1.ResourceSliceSpec{Driver: driver, NodeName: &node, Pool: resourcev1.ResourcePool{Name: "p", ResourceSliceCount: 1}}}
	}
	for _, s := range []*resourcev1.ResourceSlice{
		slice("a-1", "a.example.com", "node-a"), slice("a-2", "a.example.com", "node-a"),
		slice("b-1", "b.example.com", "node-a"), slice("other", "a.example.com", "node-b"),
	} {
		if _, err := b.cs.ResourceV1().ResourceSlices().Create(context.Background(), s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	want := map[string]int{"a.example.com": 2, "b.example.com": 1}
	b.waitFor("the slices counted by driver", func() bool {
		got, p := b.n.DriverSlices()
		return p == nil && maps.Equal(got, want)
	})
}
