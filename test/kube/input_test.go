//go:build linux

package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/plugd/plugd/api"
	"github.com/plugd/plugd/internal/testenv"
	"github.com/plugd/plugd/plugin"
)

// The Kubernetes API's answers are input too: whoever may write this
// node's objects can make them large, odd or duplicated, and plugd stays
// bounded, writes only on a real change and touches only its own.

// startNodePlugd runs plugd for node (created) with plugd's
// ServiceAccount, the kubelet not read (address none), expecting what
// expect lists (YAML list items). It returns plugd and the registry
// directory.
func startNodePlugd(t *testing.T, node, expect string) (*plugd, string, string) {
	t.Helper()
	applyManifest(t, "deploy/kubernetes/daemonset.yaml")
	token := plugdToken(t)
	dir := testenv.ShortDir(t, "kube")
	reg := filepath.Join(dir, "plugins_registry")
	for _, d := range []string{reg, filepath.Join(dir, "plugins")} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := cp.WriteKubeconfig(kubeconfig, token); err != nil {
		t.Fatal(err)
	}
	config := fmt.Sprintf(`mode: observe
registryDir: %s
handlers: [{type: CSIPlugin, handler: csi}, {type: DRAPlugin, handler: dra}]
liveness: {probeInterval: 300ms}
kubernetes: {kubeconfig: %s, nodeName: %s, kubelet: {address: none}}
expect:
%s`, reg, kubeconfig, node, expect)
	return startPlugd(t, dir, config), reg, dir
}

// waitLog waits until plugd has logged text.
func (p *plugd) waitLog(t *testing.T, text string) {
	t.Helper()
	eventually(t, "plugd to log "+text, func() (bool, string) {
		return strings.Contains(p.out.String(), text), ""
	})
}

// fastAdmin is the admin's client without client-go's default rate limit
// (5 requests a second), for creating thousands of objects.
func fastAdmin(t *testing.T) kubernetes.Interface {
	t.Helper()
	rc := cp.Config(cp.AdminToken)
	rc.QPS, rc.Burst = 1000, 1000
	c, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// metricValue is the value of the metric name in plugd's /metrics.
func metricValue(t *testing.T, pd *plugd, name string, labels ...string) float64 {
	t.Helper()
	m, _ := plugctlMetrics(t, pd)
	s, ok := metric(m, name, labels...)
	if !ok {
		t.Fatalf("plugd's /metrics has no %s %v", name, labels)
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// maxHeapWithSlices bounds plugd's Go heap (go_memstats_heap_alloc_bytes:
// live objects, and garbage not yet collected) once it has read 3,000
// ResourceSlices of 8.8 KB of its node (and 3,000 of another node are in
// the cluster). Kept whole they took plugd's RSS to 286 MB (heap 227 MB);
// it keeps their pools and their devices' names and taints (heap 52 MB,
// RSS 98 MB, with the slices of the other node in the cluster).
const maxHeapWithSlices = 64 << 20

// Thousands of large objects of plugd's node, and a Node condition of
// 1 MiB: the informers keep what plugd reads, plugd's heap stays small,
// what it shows stays bounded, and the view counts the slices.
func TestLargeAnswers(t *testing.T) {
	const node, other, n = "node-large", "node-large-other", 3000
	ctx := context.Background()
	c := fastAdmin(t)
	huge := strings.Repeat("x", 1<<20)
	// Someone else's condition of 1 MiB, and one of the type plugd
	// expects (someone wrote it before plugd ran).
	createNode(t, node, corev1.Taint{Key: taintKey, Effect: corev1.TaintEffectNoSchedule})
	patch := fmt.Sprintf(`{"status":{"conditions":[{"type":"example.com/Huge","status":"True","reason":"Big","message":%q},{"type":%q,"status":"True","reason":"Big","message":%q}]}}`, huge, csiCond, huge[:200<<10])
	if _, err := admin.CoreV1().Nodes().Patch(ctx, node, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{FieldManager: "someone-else"}, "status"); err != nil {
		t.Fatal(err)
	}
	// A CSINode of 3,000 drivers.
	drivers := make([]storagev1.CSINodeDriver, n)
	for i := range drivers {
		drivers[i] = storagev1.CSINodeDriver{Name: fmt.Sprintf("driver-%04d.example.com", i), NodeID: node, TopologyKeys: []string{"topology.example.com/zone"}}
	}
	cn, err := admin.StorageV1().CSINodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cn.Spec.Drivers = drivers
	if _, err := admin.StorageV1().CSINodes().Update(ctx, cn, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	pd, reg, _ := startNodePlugd(t, node, fmt.Sprintf("  - {type: CSIPlugin, name: %s}\n  - {type: DRAPlugin, name: %s}\n", csiName, draName))
	// A registration socket of the driver, for its view in the status API.
	testenv.StartPlugin(t, plugin.Config{Dir: reg, Socket: "dra.sock", Type: "DRAPlugin", Name: draName, Versions: []string{"1.0.0"}})
	pd.waitKubelet(t, draName, api.KubeletUnknown, "NoResourceSlices")
	base := metricValue(t, pd, "go_memstats_heap_alloc_bytes")

	// 3,000 ResourceSlices of 8.8 KB for the node, as a DRA driver (or
	// anyone with create on resourceslices) may publish.
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < n; i += 8 {
				if _, err := c.ResourceV1().ResourceSlices().Create(ctx, largeSlice(node, i, n), metav1.CreateOptions{}); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	// As many of another node, which plugd's field selector keeps out.
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < n; i += 8 {
				if _, err := c.ResourceV1().ResourceSlices().Create(ctx, largeSlice(other, i, n), metav1.CreateOptions{}); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, nd := range []string{node, other} {
			c.ResourceV1().ResourceSlices().DeleteCollection(context.Background(), metav1.DeleteOptions{}, metav1.ListOptions{FieldSelector: "spec.nodeName=" + nd})
		}
	})
	js, _ := json.Marshal(largeSlice(node, 0, n))
	t.Logf("created %d ResourceSlices of %d bytes for the node and as many for %s in %s", n, len(js), other, time.Since(start).Round(time.Millisecond))
	eventually(t, "the view counting every slice", func() (bool, string) {
		v := pd.plugin(t, draName).Kubelet
		return v != nil && strings.Contains(v.Message, fmt.Sprintf("%d ResourceSlices for driver", n)), fmt.Sprintf("%+v", v)
	})
	heap := metricValue(t, pd, "go_memstats_heap_alloc_bytes")
	rss := metricValue(t, pd, "process_resident_memory_bytes")
	t.Logf("plugd with %d ResourceSlices of its node: heap %.1f MB (%.1f MB before them), RSS %.1f MB", n, heap/1e6, base/1e6, rss/1e6)
	if heap > maxHeapWithSlices {
		t.Errorf("plugd's heap is %.1f MB with %d ResourceSlices of its node; want at most %d MB", heap/1e6, n, maxHeapWithSlices>>20)
	}

	// What it shows is bounded: the views, the doctor's findings, the
	// condition it writes over the 1 MiB one.
	c1 := waitCondition(t, node, csiCond, corev1.ConditionFalse, "SocketMissing")
	if len(c1.Message) > 512 {
		t.Errorf("plugd's condition message is %d bytes", len(c1.Message))
	}
	for _, path := range []string{"/v1/plugins", "/v1/findings"} {
		body, err := getUnix(ctx, pd.socket, path)
		if err != nil || len(body) > 64<<10 {
			t.Errorf("GET %s: %d bytes, %v; want at most 64 KiB", path, len(body), err)
		}
	}
	for line := range strings.Lines(pd.out.String()) {
		if len(line) > 8<<10 {
			t.Errorf("plugd logged a line of %d bytes: %.200s...", len(line), line)
		}
	}
	select {
	case <-pd.done:
		t.Fatalf("plugd exited: %s", pd.out)
	default:
	}
}

// largeSlice is slice i of count of a pool of the DRA driver on node: 32
// devices of 4 attributes, 8.8 KB of JSON.
func largeSlice(node string, i, count int) *resourceapi.ResourceSlice {
	devices := make([]resourceapi.Device, 32)
	for d := range devices {
		attr := func(s string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{StringValue: &s} }
		devices[d] = resourceapi.Device{Name: fmt.Sprintf("gpu-%d-%d", i, d), Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			"model":     attr("an-accelerator-of-the-large-kind-" + strconv.Itoa(d)),
			"driverVer": attr("1.2.3-build-4567890-with-a-long-suffix"),
			"uuid":      attr(fmt.Sprintf("GPU-%08d-%04d-aaaa-bbbb-cccccccccccc", i, d)),
			"pciBusID":  attr(fmt.Sprintf("0000:%02x:%02x.0-some-more-text", i%256, d)),
		}}
	}
	return &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%s-%d", node, "pool", i)},
		Spec: resourceapi.ResourceSliceSpec{Driver: draName, NodeName: &node,
			Pool: resourceapi.ResourcePool{Name: "pool", Generation: 1, ResourceSliceCount: int64(count)}, Devices: devices}}
}

// A second entry of plugd's condition type, put there by a status PUT
// (the API accepts it; a strategic merge patch then updates only the
// first): once the plugin goes, plugd removes its duplicate rather than
// leave it saying True, and leaves an entry of the type in another's form
// alone.
func TestDuplicateConditions(t *testing.T) {
	const node = "node-dup"
	ctx := context.Background()
	createNode(t, node, corev1.Taint{Key: taintKey, Effect: corev1.TaintEffectNoSchedule})
	pd, reg, dir := startNodePlugd(t, node, fmt.Sprintf("  - {type: CSIPlugin, name: %s}\n", csiName))
	apiKubelet{t, node}.setCSIDriver(csiName, node)
	csi := startCSI(t, reg, filepath.Join(dir, "plugins"), csiName, node)
	mine := waitCondition(t, node, csiCond, corev1.ConditionTrue, "Inferred")

	n := getNode(t, node)
	others := corev1.NodeCondition{Type: csiCond, Status: corev1.ConditionTrue, Reason: "Noted", Message: "someone else's note", LastHeartbeatTime: mine.LastHeartbeatTime, LastTransitionTime: mine.LastTransitionTime}
	n.Status.Conditions = append(n.Status.Conditions, *mine, others) // a copy of plugd's, and another's
	if _, err := admin.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{FieldManager: "someone-else"}); err != nil {
		t.Fatal(err)
	}
	entries := func() []corev1.NodeCondition {
		var out []corev1.NodeCondition
		for _, c := range getNode(t, node).Status.Conditions {
			if string(c.Type) == csiCond {
				out = append(out, c)
			}
		}
		return out
	}
	if got := entries(); len(got) != 3 {
		t.Fatalf("the API server kept %d entries of %s, want 3: %+v", len(got), csiCond, got)
	}
	pd.plugin(t, csiName) // plugd serves on
	csi.Close()
	eventually(t, "plugd's duplicate removed once the plugin went, another's entry kept", func() (bool, string) {
		got := entries()
		var managers []string // plugd removes only what managedFields say it set
		for _, m := range getNode(t, node).ManagedFields {
			managers = append(managers, m.Manager+" "+string(m.FieldsV1.Raw))
		}
		return len(got) == 2 && got[0].Status == corev1.ConditionFalse && got[0].Reason == "SocketMissing" && got[1] == others, fmt.Sprintf("%+v; managedFields %s", got, managers)
	})
	if !strings.Contains(pd.out.String(), "Node condition entry removed") {
		t.Errorf("plugd did not log the removal")
	}
}

// A CSINode nodeID with control characters (the API checks only its
// length) in the message of plugd's condition: the message's 512-byte cut
// once fell inside a character, so the Node never said what plugd wrote,
// and every Node update by anyone brought another patch of the status.
// Ten drivers move the cut a byte at a time across the id's ten-byte
// pattern. Once plugd has written, the admin's label updates of the Node
// bring no write of plugd's.
func TestOddNodeIDWrittenOnce(t *testing.T) {
	const node = "node-odd"
	ctx := context.Background()
	createNode(t, node, corev1.Taint{Key: taintKey, Effect: corev1.TaintEffectNoSchedule})
	var expect strings.Builder
	for i := range 10 {
		fmt.Fprintf(&expect, "  - {type: CSIPlugin, name: csi-%d.example.com}\n", i)
	}
	pd, reg, dir := startNodePlugd(t, node, expect.String())
	k := apiKubelet{t, node}
	for i, shift := range [][2]int{{0, 0}, {0, 1}, {0, 2}, {0, 3}, {0, 4}, {1, 1}, {1, 2}, {1, 3}, {2, 0}, {2, 1}} {
		name := fmt.Sprintf("csi-%d.example.com", i)
		startCSI(t, reg, filepath.Join(dir, "plugins"), name, node)
		k.setCSIDriver(name, strings.Repeat("\x01", shift[0])+strings.Repeat("x", shift[1])+strings.Repeat("\x01\x01é", 47))
	}
	for i := range 10 {
		waitCondition(t, node, fmt.Sprintf("csi-%d.example.com/CSIPluginReady", i), corev1.ConditionFalse, "NodeIDMismatch")
	}
	writes := func() float64 {
		return metricValue(t, pd, "plugd_kubernetes_writes_total", `operation="patch_node_status"`)
	}
	before := settledWrites(t, writes)
	from := time.Now()
	for i := range 5 {
		patch := fmt.Sprintf(`{"metadata":{"labels":{"example.com/touched":"%d"}}}`, i)
		if _, err := admin.CoreV1().Nodes().Patch(ctx, node, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{FieldManager: "admin"}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second) // updates a second apart, as others' come
	}
	time.Sleep(5 * time.Second) // the window measured: past plugd's coalescing
	byVerb, err := auditCountOf(plugdUser, "nodes", from, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if after := writes(); after != before || byVerb["patch"] != 0 {
		t.Errorf("five label updates of the Node by the admin brought %v patches of plugd's (audit log: %v); want none", after-before, byVerb)
	}
}

// settledWrites waits until plugd's count of writes (writes) has not
// changed for longer than plugd's coalescing bound, and returns it. A
// change of a condition's message with its status kept is written once it
// has held for 3s, and at most 10s (maxCoalesce in kubenode) after the
// first such change: a count unchanged for 11s has no write pending
// behind it. The poll is the pace of looking at a counter that has no
// event of its own; wait is the failure bound, for writes that never
// settle.
func settledWrites(t *testing.T, writes func() float64) float64 {
	t.Helper()
	const quiet = 11 * time.Second // past maxCoalesce (10s)
	deadline := time.Now().Add(wait)
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	last, since := writes(), time.Now()
	for {
		<-tick.C
		now := writes()
		switch {
		case now != last:
			last, since = now, time.Now()
		case time.Since(since) > quiet:
			t.Logf("plugd's writes settled at %.0f, unchanged for %s", last, quiet)
			return last
		}
		if time.Now().After(deadline) {
			t.Fatalf("plugd's writes did not settle within %s: %.0f, last changed %s ago", wait, last, time.Since(since).Round(time.Millisecond))
		}
	}
}
