package kubenode

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A DeviceTaintRule that taints every device of the driver makes it
// False DevicesTainted, naming the rule's key, as a taint in its slice
// does; deleted, True again. Read through the informer, as Run reads it.
func TestDeviceTaintRule(t *testing.T) {
	b := newBenchWith(t, func(c *Config) { c.Expect = []Expectation{draExp} }, &corev1.Node{})
	started := b.clock.Now().Add(-time.Hour)
	sock := draSock
	sock.Created = started
	b.setPlugins(sock)
	b.setKubelet(started, sock.Path)
	ctx := context.Background()
	for _, sl := range draPool(1, 2) {
		sl.Name = sl.Spec.Devices[0].Name
		if _, err := b.cs.ResourceV1().ResourceSlices().Create(ctx, sl, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	b.waitFor("the slices", func() bool { return len(b.n.snapshot().slices) == 2 })
	b.step(0)
	drv := draExp.Name
	rule := &resourcev1.DeviceTaintRule{ObjectMeta: metav1.ObjectMeta{Name: "maintenance"}, Spec: resourcev1.DeviceTaintRuleSpec{
		DeviceSelector: &resourcev1.DeviceTaintSelector{Driver: &drv},
		Taint:          resourcev1.DeviceTaint{Key: "example.com/maintenance", Effect: resourcev1.DeviceTaintEffectNoSchedule}}}
	if _, err := b.cs.ResourceV1().DeviceTaintRules().Create(ctx, rule, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	b.waitFor("the rule", func() bool { r, _ := b.n.taintRulesNow(); return len(r) == 1 })
	b.step(time.Second)
	c := findCondition(b.n.snapshot().node, draExp.Condition)
	if c == nil || c.Reason != ReasonDevicesTainted || !strings.Contains(c.Message, "(example.com/maintenance)") {
		t.Fatalf("with the rule: %+v", c)
	}
	if err := b.cs.ResourceV1().DeviceTaintRules().Delete(ctx, "maintenance", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	b.waitFor("the rule gone", func() bool { r, _ := b.n.taintRulesNow(); return len(r) == 0 })
	b.step(time.Second)
	if w := b.writes(); !slices.Equal(w, []string{"True/PluginReady", "False/DevicesTainted", "True/PluginReady"}) {
		t.Errorf("written %q", w)
	}
}
