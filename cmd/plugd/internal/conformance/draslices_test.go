package conformance

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

func slice(name, node, pool string, generation, count int64) resourceapi.ResourceSlice {
	s := resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: resourceapi.ResourceSliceSpec{
		Driver: "dra.example.com", Pool: resourceapi.ResourcePool{Name: pool, Generation: generation, ResourceSliceCount: count},
		Devices: []resourceapi.Device{{Name: "dev-" + name}}}}
	if node != "" {
		s.Spec.NodeName = ptr.To(node)
	} else {
		s.Spec.AllNodes = ptr.To(true)
	}
	return s
}

// What the API server cannot see in a driver's ResourceSlices: a slice for
// another node, a pool whose newest generation lacks slices. The rest
// (names, devices, attributes) it validated on create. The end-to-end run
// against a real API server is test/kube's TestConformanceDRAResourceSlices.
func TestJudgeSlices(t *testing.T) {
	for _, tc := range []struct {
		name  string
		items []resourceapi.ResourceSlice
		want  string // "" passes
	}{
		{"one complete pool", []resourceapi.ResourceSlice{slice("a", "node-1", "node-1", 1, 2), slice("b", "node-1", "node-1", 1, 2)}, ""},
		{"an older generation left beside a complete newer one", []resourceapi.ResourceSlice{slice("a", "node-1", "p", 1, 2), slice("b", "node-1", "p", 2, 1)}, ""},
		{"a pool for every node", []resourceapi.ResourceSlice{slice("a", "", "network", 3, 1), slice("b", "node-1", "node-1", 1, 1)}, ""},
		{"none", nil, "no ResourceSlice names driver dra.example.com"},
		{"another node", []resourceapi.ResourceSlice{slice("a", "node-2", "node-2", 1, 1)}, `ResourceSlice a is for node "node-2", not node-1`},
		{"incomplete", []resourceapi.ResourceSlice{slice("a", "node-1", "p", 4, 2), slice("b", "node-1", "p", 3, 2)}, `pool "p" is incomplete: generation 4 has 1 of the 2 slices`},
		{"too many", []resourceapi.ResourceSlice{slice("a", "node-1", "p", 1, 1), slice("b", "node-1", "p", 1, 1)}, `pool "p" is incomplete: generation 1 has 2 of the 1 slices`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			seen, err := judgeSlices(tc.items, "dra.example.com", "node-1")
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("failed: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("error %v, want one saying %q (seen %q)", err, tc.want, seen)
			}
		})
	}
}

// A --kubeconfig the kit cannot read (missing, or endless) fails
// dra/resource-slices at once, saying which file and why, and nothing
// else.
func TestResourceSlicesBadKubeconfig(t *testing.T) {
	for _, path := range []string{filepath.Join(t.TempDir(), "missing.kubeconfig"), "/dev/zero"} {
		t.Run(filepath.Base(path), func(t *testing.T) {
			run := newKitRun(t, "dra", "", 5*time.Second)
			run.cfg.Kubeconfig, run.cfg.NodeName = path, "node-1"
			run.run()
			run.check(t)
			for _, c := range run.rep.Checks {
				switch {
				case c.ID == checkDRASlices && (c.Status != statusFail || !strings.Contains(c.Seen, "--kubeconfig "+path)):
					t.Errorf("%s: %s %q, want a failure naming --kubeconfig %s", c.ID, c.Status, c.Seen, path)
				case c.ID == checkDRASlices:
					t.Logf("%s: %s", c.ID, c.Seen)
				case c.Status == statusFail:
					t.Errorf("%s failed: %s", c.ID, c.Seen)
				}
			}
		})
	}
}
