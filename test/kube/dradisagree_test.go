//go:build linux

package kube

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/plugd/plugd/api"
	"github.com/plugd/plugd/internal/testenv"
	"github.com/plugd/plugd/plugin"
)

// startDRADriver runs a real DRA driver (kubeletplugin) named name that
// registers in reg, serves in its own directory under data and publishes
// one ResourceSlice for node; opts are kubeletplugin's (HealthService).
func startDRADriver(t *testing.T, reg, data, node, name string, opts ...kubeletplugin.Option) {
	t.Helper()
	dir := filepath.Join(data, name)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h, err := kubeletplugin.Start(ctx, draDriver{}, append([]kubeletplugin.Option{kubeletplugin.DriverName(name), kubeletplugin.KubeClient(admin),
		kubeletplugin.NodeName(node), kubeletplugin.RegistrarDirectoryPath(reg), kubeletplugin.PluginDataDirectoryPath(dir)}, opts...)...)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		h.Stop()
		cancel()
	})
	if err := h.PublishResources(ctx, resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
		"pool": {Slices: []resourceslice.Slice{{Devices: []resourceapi.Device{{Name: "dev-0"}}}}},
	}}); err != nil {
		t.Fatal(err)
	}
}

// publishSlice creates a ResourceSlice of driver for node with the admin's
// access, as a publisher apart from the driver's kubelet plugin would.
func publishSlice(t *testing.T, node, driver string) {
	t.Helper()
	s := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{GenerateName: node + "-" + driver + "-"},
		Spec: resourceapi.ResourceSliceSpec{Driver: driver, NodeName: &node,
			Pool:    resourceapi.ResourcePool{Name: node, ResourceSliceCount: 1},
			Devices: []resourceapi.Device{{Name: "dev-0"}}}}
	if _, err := admin.ResourceV1().ResourceSlices().Create(context.Background(), s, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// doctorFindings runs plugctl doctor against plugd and keeps the findings
// of check.
func doctorFindings(t *testing.T, pd *plugd, check string) ([]api.Finding, string) {
	t.Helper()
	out, _ := plugctl(t, "--socket", pd.socket, "doctor", "-o", "json")
	var l api.FindingList
	decode(t, out, &l)
	var got []api.Finding
	for _, f := range l.Findings {
		if f.Check == check {
			got = append(got, f)
		}
	}
	return got, out
}

// What the real kubelet and DRA drivers disagree on, as plugctl doctor
// names it beside the kubelet under test (issue 34 item 3): the health
// service by the kubelet's version (v1.37 asks only drivers that advertise
// it, and stops at Unimplemented; v1.36 asks every driver, every 5 s:
// kubernetes/kubernetes#141855), slices of a driver that is not
// registered on the node at all (the kubelet never deletes them: only
// its drivers' own, when it lets them go), and slices of a driver whose
// registration the kubelet refuses.
func TestDRADisagreements(t *testing.T) {
	const node = "k-dradis"
	k := startKubelet(t, node)
	applyManifest(t, "deploy/kubernetes/daemonset.yaml")
	dir := testenv.ShortDir(t, "kd")
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := cp.WriteKubeconfig(kubeconfig, plugdToken(t)); err != nil {
		t.Fatal(err)
	}
	pd := startPlugd(t, dir, fmt.Sprintf(`mode: observe
registryDir: %s
handlers: [{type: CSIPlugin, handler: csi}, {type: DRAPlugin, handler: dra}, {type: DevicePlugin, handler: deviceplugin}]
kubernetes:
  kubeconfig: %s
  nodeName: %s
  kubelet: {address: %q, caFile: %s}
doctor: {kubeletRoots: [%s], procDir: none}
`, k.RegistryDir, kubeconfig, node, k.Addr, k.CertFile, filepath.Join(dir, "none")))

	// A driver whose registration the kubelet refuses (no DRA service it
	// knows) while its slices are published: the kubelet holds nothing to
	// delete them for. Started first: the finding waits out the kubelet's
	// wipe delay.
	refusedAt := time.Now()
	testenv.StartPlugin(t, plugin.Config{Dir: k.RegistryDir, Socket: "refused-reg.sock", Type: "DRAPlugin", Name: "refused.example.com", Versions: []string{"v2.DRAPlugin"}})
	publishSlice(t, node, "refused.example.com")

	quiet, claims := "quiet.example.com", "claims.example.com"
	startDRADriver(t, k.RegistryDir, filepath.Join(dir, "dra"), node, quiet, kubeletplugin.HealthService(false))
	startDRADriver(t, k.RegistryDir, filepath.Join(dir, "dra"), node, claims) // advertises the health service; draDriver answers ErrHealthNotSupported
	for _, name := range []string{quiet, claims} {
		pd.waitKubelet(t, name, api.KubeletRegistered, "")
	}
	pd.waitKubelet(t, "refused.example.com", api.KubeletNotRegistered, "SeenNotRegistered")

	t.Run("the health service the kubelet asks for", func(t *testing.T) {
		// The test's kubelet is built without its version (its Node says
		// v0.0.0-master), so the doctor judges by the newest rules; the
		// rules of each version are TestDRAHealthDisagreements'. What the
		// kubelet under test does is read from its log.
		var fs []api.Finding
		eventually(t, "the doctor's health-service-missing of "+claims, func() (bool, string) {
			var out string
			fs, out = doctorFindings(t, pd, "health-service-missing")
			return len(fs) == 1, out
		})
		f := fs[0]
		if ev := strings.Join(f.Evidence, "\n"); f.Name != claims || f.Severity != api.SeverityWarning ||
			!strings.Contains(ev, "of no release version") || !strings.Contains(ev, "uses v1.DRAPlugin and v1.DRAResourceHealth with it") ||
			!strings.Contains(ev, "(v1.DRAResourceHealth) on "+filepath.Join(dir, "dra", claims, "dra.sock")+": Unimplemented") {
			t.Errorf("health-service-missing: %+v", f)
		}
		for _, check := range []string{"health-service-expected", "health-service-unadvertised"} {
			if other, out := doctorFindings(t, pd, check); len(other) != 0 {
				t.Errorf("%s:\n%s", check, out)
			}
		}
		if !kubeletBin.AtLeast("1.37") {
			needKubelet(t, "1.36", "the kubelet's health stream is alpha, off by default, before v1.36")
			// A v1.36 kubelet asks both drivers, advertised or not, and
			// again every 5 s (kubernetes/kubernetes#141855).
			eventually(t, "the v1.36 kubelet asking again", func() (bool, string) {
				return logCount(k.LogFile(), "WatchResources health stream has ended") >= 4, k.Tail(10)
			})
			return
		}
		// A v1.37 kubelet asked the driver that advertises the service
		// once, took Unimplemented for "no health reporting" and stopped;
		// it never asked the other. Its retry period is 5 s: a quiet 6 s
		// shows no second ask.
		eventually(t, "the kubelet giving up the health stream of "+claims, func() (bool, string) {
			return logCount(k.LogFile(), "Driver does not support WatchResources health stream, stopping") == 1, k.Tail(10)
		})
		time.Sleep(6 * time.Second) // a window in which a retry would show: an absence has no event to wait on
		if got := logCount(k.LogFile(), "WatchResources health stream has ended"); got != 1 {
			t.Errorf("the kubelet's health streams ended %d times; want 1 (only %s's, once)", got, claims)
		}
	})

	t.Run("slices of a driver not registered here at all", func(t *testing.T) {
		publishSlice(t, node, "gone.example.com")
		var fs []api.Finding
		eventually(t, "the doctor's dra-slices-unregistered", func() (bool, string) {
			var out string
			fs, out = doctorFindings(t, pd, "dra-slices-unregistered")
			return len(fs) == 1, out
		})
		f := fs[0]
		if f.Name != "gone.example.com" || f.Severity != api.SeverityWarning || !strings.Contains(f.Summary, "1 ResourceSlices of DRA driver gone.example.com") {
			t.Errorf("dra-slices-unregistered: %+v", f)
		}
		// The remedy's command, run: the slices go, and so does the finding.
		_, sel, ok := strings.Cut(f.Remedy, "kubectl delete resourceslices --field-selector ")
		if !ok || sel != "spec.nodeName="+node+",spec.driver=gone.example.com" {
			t.Fatalf("remedy %q", f.Remedy)
		}
		if err := admin.ResourceV1().ResourceSlices().DeleteCollection(context.Background(), metav1.DeleteOptions{}, metav1.ListOptions{FieldSelector: sel}); err != nil {
			t.Fatal(err)
		}
		eventually(t, "the finding gone", func() (bool, string) {
			fs, out := doctorFindings(t, pd, "dra-slices-unregistered")
			return len(fs) == 0, out
		})
	})

	t.Run("slices of a driver the kubelet refuses", func(t *testing.T) {
		var fs []api.Finding
		eventuallyWithin(t, time.Minute, "the doctor's dra-slices-not-held", func() (bool, string) {
			var out string
			fs, out = doctorFindings(t, pd, "dra-slices-not-held")
			return len(fs) == 1, out
		})
		f := fs[0]
		if f.Name != "refused.example.com" || !strings.Contains(f.Remedy, "refuses the driver's registration") {
			t.Errorf("dra-slices-not-held: %+v", f)
		}
		if d := time.Since(refusedAt); d < 40*time.Second {
			t.Errorf("told %s after the driver came: before the kubelet's wipe delay (30 s) and its margin (10 s)", d)
		} else {
			t.Logf("dra-slices-not-held told %s after the driver came", d.Round(time.Second))
		}
		// The drivers the kubelet holds have slices too, and no finding.
		for _, check := range []string{"dra-slices-not-held", "dra-slices-unregistered"} {
			if fs, out := doctorFindings(t, pd, check); len(fs) > 1 || len(fs) == 1 && fs[0].Name != "refused.example.com" {
				t.Errorf("%s of drivers the kubelet holds:\n%s", check, out)
			}
		}
	})
}

// logCount counts the lines of the file at path that hold s.
func logCount(path, s string) int {
	b, _ := os.ReadFile(path)
	return strings.Count(string(b), s)
}
