//go:build linux

package kube

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/plugd/plugd/internal/testenv"
)

// healthDRA is a DRA driver whose devices' health the test sets: every
// health stream (the kubelet's, plugd's) gets the current report at once
// and at every change, and again every 10 s.
type healthDRA struct {
	draDriver
	mu      sync.Mutex
	devices []kubeletplugin.DeviceHealth
	changed chan struct{} // closed and replaced at every change
}

func newHealthDRA() *healthDRA { return &healthDRA{changed: make(chan struct{})} }

func (d *healthDRA) set(health kubeletplugin.HealthStatus, pool string, devices ...string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.devices = nil
	for _, n := range devices {
		d.devices = append(d.devices, kubeletplugin.DeviceHealth{PoolName: pool, DeviceName: n, Health: health, HealthCheckTimeout: time.Minute})
	}
	close(d.changed)
	d.changed = make(chan struct{})
}

func (d *healthDRA) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	for {
		d.mu.Lock()
		r, changed := kubeletplugin.DeviceHealthReport{Devices: slices.Clone(d.devices)}, d.changed
		d.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil
		case reports <- r:
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		case <-time.After(10 * time.Second):
		}
	}
}

// draPoolSlice is slice i of pool gpus of the DRA driver on node, at
// generation gen, one of count, with one device gpu-i, tainted with
// taint if it is not empty.
func draPoolSlice(node string, i int, gen, count int64, taint string) *resourceapi.ResourceSlice {
	d := resourceapi.Device{Name: fmt.Sprintf("gpu-%d", i)}
	if taint != "" {
		d.Taints = []resourceapi.DeviceTaint{{Key: taint, Effect: resourceapi.DeviceTaintEffectNoSchedule}}
	}
	return &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-gpus-%d", node, i)},
		Spec: resourceapi.ResourceSliceSpec{Driver: draName, NodeName: &node,
			Pool: resourceapi.ResourcePool{Name: "gpus", Generation: gen, ResourceSliceCount: count}, Devices: []resourceapi.Device{d}}}
}

// grantDeviceClasses grants plugd list and watch on DeviceClasses, as the
// chart does when an entry names deviceClasses, until the test ends.
func grantDeviceClasses(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	const name = "plugd-deviceclasses-layers"
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"deviceclasses"}, Verbs: []string{"list", "watch"}}}}
	if _, err := admin.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	bind(t, name)
	t.Cleanup(func() {
		admin.RbacV1().ClusterRoleBindings().Delete(context.Background(), name, metav1.DeleteOptions{})
		admin.RbacV1().ClusterRoles().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
}

// The layers of a DRA driver's readiness, beside the real kubelet and API
// server, with a real kubeletplugin driver whose slices the test writes
// itself (the driver's identity: the admin's, as startDRA's) and whose
// health it sets: every write of the condition is asserted.
func TestDRALayers(t *testing.T) {
	const node = "node-layers"
	ctx := context.Background()
	k := startKubelet(t, node)
	applyManifest(t, "deploy/kubernetes/daemonset.yaml")
	dir := testenv.ShortDir(t, "dl")
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := cp.WriteKubeconfig(kubeconfig, plugdToken(t)); err != nil {
		t.Fatal(err)
	}
	// The chart grants deviceclasses only when an entry names them; this
	// one does: the class exists, and selects every device of the driver.
	classes := admin.ResourceV1().DeviceClasses()
	grantDeviceClasses(t)
	className := "layers.gpu.example.com"
	setClass := func(expr string) {
		t.Helper()
		c := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: className},
			Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: expr}}}}}
		cur, err := classes.Get(ctx, className, metav1.GetOptions{})
		if err != nil {
			if _, err := classes.Create(ctx, c, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			return
		}
		c.ResourceVersion = cur.ResourceVersion
		if _, err := classes.Update(ctx, c, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	matchAll := `device.driver == "` + draName + `"`
	setClass(matchAll)
	t.Cleanup(func() { classes.Delete(context.Background(), className, metav1.DeleteOptions{}) })
	conds := watchConditions(t, node, nil)
	pd := startPlugd(t, dir, fmt.Sprintf(`mode: observe
registryDir: %s
handlers: [{type: DRAPlugin, handler: dra}]
kubernetes:
  kubeconfig: %s
  nodeName: %s
  kubelet: {address: %q, caFile: %s}
expect:
  - {type: DRAPlugin, name: %s, deviceClasses: [layers.gpu.example.com]}
`, k.RegistryDir, kubeconfig, node, k.Addr, k.CertFile, draName))
	drv := newHealthDRA()
	if err := os.MkdirAll(filepath.Join(dir, "dra"), 0o750); err != nil {
		t.Fatal(err)
	}
	dctx, cancel := context.WithCancel(ctx)
	h, err := kubeletplugin.Start(dctx, drv, kubeletplugin.DriverName(draName), kubeletplugin.KubeClient(admin),
		kubeletplugin.NodeName(node), kubeletplugin.RegistrarDirectoryPath(k.RegistryDir), kubeletplugin.PluginDataDirectoryPath(filepath.Join(dir, "dra")))
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		h.Stop()
		cancel()
		admin.ResourceV1().ResourceSlices().DeleteCollection(context.Background(), metav1.DeleteOptions{}, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
	})
	drv.set(kubeletplugin.HealthStatusHealthy, "gpus", "gpu-0", "gpu-1", "gpu-2")
	cond := draName + "/DRAPluginReady"
	slicesAPI := admin.ResourceV1().ResourceSlices()
	put := func(sl *resourceapi.ResourceSlice) {
		t.Helper()
		cur, err := slicesAPI.Get(ctx, sl.Name, metav1.GetOptions{})
		if err != nil {
			if _, err := slicesAPI.Create(ctx, sl, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			return
		}
		sl.ResourceVersion = cur.ResourceVersion
		if _, err := slicesAPI.Update(ctx, sl, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// writes checks the condition's writes since from: want, in order,
	// each STATUS/REASON, and each message holds its text of says.
	writes := func(t *testing.T, from time.Time, want []string, says ...string) []transition {
		t.Helper()
		eventually(t, "the watch bringing "+cond, func() (bool, string) {
			c := condition(getNode(t, node), cond)
			trs := conds.since(cond, from)
			return c != nil && len(trs) > 0 && trs[len(trs)-1].message == c.Message, fmt.Sprintf("%d writes", len(trs))
		})
		trs := conds.since(cond, from)
		var got []string
		for i, tr := range trs {
			got = append(got, tr.String())
			if i < len(says) && !strings.Contains(tr.message, says[i]) {
				t.Errorf("write %d, %s, says %q; want it to say %q", i, tr, tr.message, says[i])
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s was written %q; want %q", cond, got, want)
		}
		t.Logf("%s: %s", cond, strings.Join(got, " -> "))
		return trs
	}

	waitCondition(t, node, cond, corev1.ConditionFalse, "NoResourceSlices")

	t.Run("a pool in three slices, the third 2s later: PoolIncomplete, then True, no flap", func(t *testing.T) {
		from := time.Now()
		put(draPoolSlice(node, 0, 1, 3, ""))
		put(draPoolSlice(node, 1, 1, 3, ""))
		waitCondition(t, node, cond, corev1.ConditionFalse, "PoolIncomplete")
		time.Sleep(time.Until(from.Add(2 * time.Second))) // the scenario's pace, not a wait for plugd
		put(draPoolSlice(node, 2, 1, 3, ""))
		waitCondition(t, node, cond, corev1.ConditionTrue, "PluginReady")
		writes(t, from, []string{"False/PoolIncomplete", "True/PluginReady"}, "pool gpus generation 1 has 2 of 3 ResourceSlices", "3 usable devices in pool gpus")
	})

	t.Run("republished to generation 2 slice by slice: no write", func(t *testing.T) {
		from := time.Now()
		for i := range 3 {
			put(draPoolSlice(node, i, 2, 3, ""))
			time.Sleep(time.Second) // slice by slice
		}
		// plugd has seen every step: its metrics show the pool complete
		// again at generation 2 (and the view's message does not change).
		time.Sleep(2 * time.Second)
		if trs := conds.since(cond, from); len(trs) != 0 {
			t.Errorf("written %v during a republish within the grace", trs)
		}
	})

	t.Run("a republish that never completes: PoolIncomplete after the grace", func(t *testing.T) {
		from := time.Now()
		put(draPoolSlice(node, 0, 3, 3, ""))
		waitFor := time.Now().Add(45 * time.Second)
		eventuallyWithin(t, time.Until(waitFor), "PoolIncomplete after the grace", func() (bool, string) {
			c := condition(getNode(t, node), cond)
			return c != nil && c.Reason == "PoolIncomplete", fmt.Sprintf("%+v", c)
		})
		trs := writes(t, from, []string{"False/PoolIncomplete"}, "pool gpus generation 3 has 1 of 3")
		if dt := trs[0].at.Sub(from); dt < 29*time.Second || dt > 35*time.Second {
			t.Errorf("PoolIncomplete written %s after the republish began; want after the grace, 30s", dt.Round(time.Millisecond))
		}
		from = time.Now()
		put(draPoolSlice(node, 1, 3, 3, ""))
		put(draPoolSlice(node, 2, 3, 3, ""))
		waitCondition(t, node, cond, corev1.ConditionTrue, "PluginReady")
		writes(t, from, []string{"True/PluginReady"})
	})

	t.Run("every device tainted NoSchedule in its slice: DevicesTainted, naming the key", func(t *testing.T) {
		from := time.Now()
		for i := range 3 {
			put(draPoolSlice(node, i, 3, 3, "example.com/xid-79"))
		}
		waitCondition(t, node, cond, corev1.ConditionFalse, "DevicesTainted")
		for i := range 3 {
			put(draPoolSlice(node, i, 3, 3, ""))
		}
		waitCondition(t, node, cond, corev1.ConditionTrue, "PluginReady")
		writes(t, from, []string{"False/DevicesTainted", "True/PluginReady"}, "(example.com/xid-79)")
	})

	t.Run("a DeviceTaintRule, served at v1: DevicesTainted, naming the key", func(t *testing.T) {
		from := time.Now()
		drvName := draName
		rule := &resourceapi.DeviceTaintRule{ObjectMeta: metav1.ObjectMeta{Name: "layers-maintenance"}, Spec: resourceapi.DeviceTaintRuleSpec{
			DeviceSelector: &resourceapi.DeviceTaintSelector{Driver: &drvName},
			Taint:          resourceapi.DeviceTaint{Key: "example.com/maintenance", Effect: resourceapi.DeviceTaintEffectNoExecute}}}
		if _, err := admin.ResourceV1().DeviceTaintRules().Create(ctx, rule, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitCondition(t, node, cond, corev1.ConditionFalse, "DevicesTainted")
		if err := admin.ResourceV1().DeviceTaintRules().Delete(ctx, rule.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		waitCondition(t, node, cond, corev1.ConditionTrue, "PluginReady")
		writes(t, from, []string{"False/DevicesTainted", "True/PluginReady"}, "(example.com/maintenance)")
	})

	t.Run("its health stream: DevicesUnhealthy within 1s, True again within 1s", func(t *testing.T) {
		from := time.Now()
		drv.set(kubeletplugin.HealthStatusUnhealthy, "gpus", "gpu-0", "gpu-1", "gpu-2")
		waitCondition(t, node, cond, corev1.ConditionFalse, "DevicesUnhealthy")
		healed := time.Now()
		drv.set(kubeletplugin.HealthStatusHealthy, "gpus", "gpu-0", "gpu-1", "gpu-2")
		waitCondition(t, node, cond, corev1.ConditionTrue, "PluginReady")
		trs := writes(t, from, []string{"False/DevicesUnhealthy", "True/PluginReady"}, "3 Unhealthy by its DRAResourceHealth stream (gpus/gpu-0, gpus/gpu-1, gpus/gpu-2)")
		if len(trs) == 2 {
			for _, c := range []struct {
				what string
				dt   time.Duration
			}{{"DevicesUnhealthy", trs[0].at.Sub(from)}, {"True", trs[1].at.Sub(healed)}} {
				t.Logf("%s written %s after the report", c.what, c.dt.Round(time.Millisecond))
				if c.dt > time.Second {
					t.Errorf("%s written %s after the report; want within 1s", c.what, c.dt.Round(time.Millisecond))
				}
			}
		}
	})

	t.Run("its DeviceClass: NoMatchingDevices, True, DeviceClassMissing, True", func(t *testing.T) {
		from := time.Now()
		setClass(`device.driver == "other.example.com"`)
		waitCondition(t, node, cond, corev1.ConditionFalse, "NoMatchingDevices")
		setClass(matchAll)
		waitCondition(t, node, cond, corev1.ConditionTrue, "PluginReady")
		if err := classes.Delete(ctx, className, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		waitCondition(t, node, cond, corev1.ConditionFalse, "DeviceClassMissing")
		setClass(matchAll)
		waitCondition(t, node, cond, corev1.ConditionTrue, "PluginReady")
		writes(t, from, []string{"False/NoMatchingDevices", "True/PluginReady", "False/DeviceClassMissing", "True/PluginReady"},
			"DeviceClass layers.gpu.example.com selects 0 of the driver's 3 usable devices", "DeviceClass layers.gpu.example.com selects 3 of the driver's 3 usable devices",
			"DeviceClass layers.gpu.example.com does not exist")
	})

	t.Run("a quiet minute: no request to the API server, the health stream resent meanwhile", func(t *testing.T) {
		from := time.Now()
		time.Sleep(time.Minute) // the window measured, not a wait for something
		to := time.Now()
		by, err := auditCount(plugdUser, from, to)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, c := range by {
			n += c
		}
		t.Logf("plugd's API requests in a quiet minute: %v", by)
		total, err := auditCount(plugdUser, pd.started, to)
		if err != nil {
			t.Fatal(err)
		}
		// Five watches stream the initial state (Node, CSINode, ResourceSlices,
		// DeviceTaintRules, and the DeviceClass the entry names, by its name):
		// no list, none reopened.
		t.Logf("plugd's requests from its start: %v", total)
		if total["list"] != 0 || total["watch"] != 5 {
			t.Errorf("plugd's reads from its start: %d list, %d watch; want 0 and 5", total["list"], total["watch"])
		}
		for l := range strings.Lines(pd.out.String()) {
			if strings.Contains(l, "DeviceTaintRules") {
				t.Logf("plugd: %s", l)
			}
		}
		if n != 0 {
			t.Errorf("plugd made %d requests of the API server in a quiet minute (%v); want none", n, by)
		}
		if trs := conds.since(cond, from); len(trs) != 0 {
			t.Errorf("written %v in a quiet minute", trs)
		}
	})
}
