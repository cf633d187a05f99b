//go:build linux

package kube

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	dpapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	dpstub "k8s.io/kubernetes/pkg/kubelet/cm/devicemanager/plugin/v1beta1"

	"github.com/plugd/plugd/internal/testenv"
)

// conformanceReport is what `plugd conformance -o json` prints, as far as
// these tests read it.
type conformanceReport struct {
	Checks []struct {
		ID       string `json:"id"`
		Status   string `json:"status"`
		Required bool   `json:"required"`
		Seen     string `json:"seen"`
	} `json:"checks"`
	Passed   bool          `json:"passed"`
	Duration time.Duration `json:"durationNanoseconds"`
}

// conformance runs plugd conformance -o json with args and env, and
// returns its report, failing the test unless the plugin passed.
func conformance(t *testing.T, env []string, args ...string) conformanceReport {
	t.Helper()
	return runConformance(t, exec.Command(filepath.Join(dirs.Bin, "plugd"), append([]string{"conformance", "-o", "json"}, args...)...), env)
}

// runConformance runs cmd, a plugd conformance -o json, with env, and
// fails the test unless the plugin passed.
func runConformance(t *testing.T, cmd *exec.Cmd, env []string) conformanceReport {
	t.Helper()
	rep, stderr, err := readConformance(t, cmd, env)
	if err != nil || !rep.Passed {
		t.Fatalf("plugd conformance: %v, passed %t; standard error:\n%s", err, rep.Passed, stderr)
	}
	t.Logf("plugd conformance: %d checks in %s", len(rep.Checks), rep.Duration.Round(time.Millisecond))
	return rep
}

// readConformance runs cmd, a plugd conformance -o json, with env, and
// returns its report, its exit and its standard error.
func readConformance(t *testing.T, cmd *exec.Cmd, env []string) (conformanceReport, string, error) {
	t.Helper()
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var rep conformanceReport
	if jerr := json.Unmarshal(stdout.Bytes(), &rep); jerr != nil {
		t.Fatalf("plugd conformance: %v; its output is no report (%v):\n%s\n%s", err, jerr, stdout.String(), stderr.String())
	}
	for _, c := range rep.Checks {
		t.Logf("%s %s (required %t): %s", c.Status, c.ID, c.Required, c.Seen)
	}
	return rep, stderr.String(), err
}

// The kubelet's own sample device plugin (k8s.io/kubernetes
// test/images/sample-device-plugin, built on the device manager's stub)
// passes every required check of plugd conformance, started by it: its
// socket goes in PLUGIN_SOCK_DIR, which the kit sets to its registry
// directory, and REGISTER_CONTROL_FILE keeps it from registering with a
// kubelet socket that is not there.
func TestConformanceSampleDevicePlugin(t *testing.T) {
	bin := buildSampleDevicePlugin(t)
	control := filepath.Join(t.TempDir(), "register")
	rep := conformance(t, []string{"REGISTER_CONTROL_FILE=" + control}, "--registry-env=PLUGIN_SOCK_DIR", "--", bin)
	if rep.Duration > 30*time.Second {
		t.Errorf("the run took %s, more than 30 s", rep.Duration)
	}
}

// The sample device plugin as it runs on a node: it registers by calling
// Register on /var/lib/kubelet/device-plugins/kubelet.sock, and again when
// a restarted kubelet makes that socket anew (the stub's Watch, 10 s after).
// plugd conformance serves that socket, in a mount namespace of its own
// whose /var/lib is an overlay (privatemounts), so the host is unchanged.
func TestConformanceSampleDevicePluginKubeletSock(t *testing.T) {
	bin := buildSampleDevicePlugin(t)
	scratch := t.TempDir()
	const dpDir = "/var/lib/kubelet/device-plugins"
	script := "mkdir -p " + dpDir + " && exec " + filepath.Join(dirs.Bin, "plugd") + " conformance -o json --endpoint-dir " + dpDir +
		" --endpoint-env PLUGIN_SOCK_DIR -- " + bin
	cmd := exec.Command(filepath.Join(dirs.Bin, "privatemounts"), "--overlay", "/var/lib="+scratch, "--", "/bin/sh", "-c", script)
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS, Pdeathsig: syscall.SIGKILL}
	rep := runConformance(t, cmd, nil)
	for _, c := range rep.Checks {
		if c.ID == "deviceplugin/kubelet-restart" && c.Status != "PASS" {
			t.Errorf("%s: %s, want PASS: %s", c.ID, c.Status, c.Seen)
		}
	}
}

// buildSampleDevicePlugin builds k8s.io/kubernetes's sample device plugin
// into the binaries' directory.
func buildSampleDevicePlugin(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(dirs.Bin, "sample-device-plugin")
	build := exec.Command("go", "build", "-o", bin, "k8s.io/kubernetes/test/images/sample-device-plugin")
	build.Dir = dirs.Module
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the sample device plugin: %v\n%s", err, out)
	}
	return bin
}

// The device manager's stub itself, run in this process, passes every
// required check with plugd conformance attached to it, the health change
// included: the kit's --health-command writes to a FIFO, on which this
// test turns Dev-2 Unhealthy with the stub's own Update.
func TestConformanceDevicePluginStub(t *testing.T) {
	dir := testenv.ShortDir(t, "reg")
	devs := []*dpapi.Device{{ID: "Dev-1", Health: dpapi.Healthy}, {ID: "Dev-2", Health: dpapi.Healthy}}
	logger := klog.Background()
	stub := dpstub.NewDevicePluginStub(logger, devs, filepath.Join(dir, "stub.sock"), "example.com/stub", false, false)
	if err := stub.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stub.Stop(logger) })
	fifo := filepath.Join(t.TempDir(), "fail-dev-2")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	told := make(chan error, 1)
	go func() {
		f, err := os.Open(fifo) // until the health command opens it to write
		if err == nil {
			_, err = io.Copy(io.Discard, f) // until it has written
			f.Close()
		}
		if err == nil {
			stub.Update([]*dpapi.Device{{ID: "Dev-1", Health: dpapi.Healthy}, {ID: "Dev-2", Health: dpapi.Unhealthy}})
		}
		told <- err
	}()
	rep := conformance(t, nil, "--registry-dir", dir, "--health-command", "echo > "+fifo)
	for _, c := range rep.Checks {
		if c.Status == "FAIL" || (c.ID == "deviceplugin/health-change" && c.Status != "PASS") {
			t.Errorf("%s: %s: %s", c.ID, c.Status, c.Seen)
		}
	}
	if err := <-told; err != nil {
		t.Error(err)
	}
}

// A DRA driver on kubeletplugin that publishes its devices to a real API
// server passes dra/resource-slices (its slices name it and its node, its
// pool complete); one that leaves its pool incomplete, publishes for
// another node or under another driver name fails that check and only it.
func TestConformanceDRAResourceSlices(t *testing.T) {
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := cp.WriteKubeconfig(kubeconfig, cp.AdminToken); err != nil {
		t.Fatal(err)
	}
	const driver = "dra.conformance.plugd.example.com" // testplugin's
	for _, tc := range []struct{ brk, fails string }{
		{"", ""},
		{"incomplete-pool", "incomplete: generation 1 has 1 of the 2 slices"},
		{"wrong-node", `is for node "conformance-dra-wrong-node-other", not conformance-dra-wrong-node`},
		{"wrong-driver", `no ResourceSlice names driver ` + driver + `; the slices of node conformance-dra-wrong-driver name ["other.` + driver + `"]`},
	} {
		t.Run("break="+tc.brk, func(t *testing.T) {
			node := strings.TrimSuffix("conformance-dra-"+tc.brk, "-")
			t.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				for _, d := range []string{driver, "other." + driver} {
					if err := admin.ResourceV1().ResourceSlices().DeleteCollection(ctx, metav1.DeleteOptions{},
						metav1.ListOptions{FieldSelector: "spec.driver=" + d}); err != nil {
						t.Errorf("deleting the ResourceSlices of %s: %v", d, err)
					}
				}
			})
			cmd := exec.Command(filepath.Join(dirs.Bin, "plugd"), "conformance", "-o", "json", "--timeout=5s",
				"--kubeconfig", kubeconfig, "--node-name", node, "--",
				filepath.Join(dirs.Bin, "testplugin"), "dra", "--registry-dir={registry-dir}", "--plugin-dir={endpoint-dir}",
				"--kubeconfig", kubeconfig, "--node-name", node, "--node-uid", "a1b2c3d4-0000-4000-8000-"+fmt.Sprintf("%012d", len(tc.brk)), "--break", tc.brk)
			rep, stderr, err := readConformance(t, cmd, nil)
			var failed []string
			for _, c := range rep.Checks {
				if c.Status == "FAIL" {
					failed = append(failed, c.ID)
				}
				if c.ID == "dra/resource-slices" && tc.fails != "" && !strings.Contains(c.Seen, tc.fails) {
					t.Errorf("dra/resource-slices saw %q; want it to say %q", c.Seen, tc.fails)
				}
			}
			if tc.fails == "" {
				if err != nil || !rep.Passed {
					t.Fatalf("plugd conformance: %v, passed %t, failed %q; standard error:\n%s", err, rep.Passed, failed, stderr)
				}
				for _, c := range rep.Checks {
					if c.ID == "dra/resource-slices" && c.Status != "PASS" {
						t.Errorf("dra/resource-slices: %s, want PASS: %s", c.Status, c.Seen)
					}
				}
				t.Logf("plugd conformance: %d checks in %s", len(rep.Checks), rep.Duration.Round(time.Millisecond))
				return
			}
			if len(failed) != 1 || failed[0] != "dra/resource-slices" || rep.Passed || err == nil {
				t.Errorf("failed %q, passed %t, exit %v; want dra/resource-slices alone failed, and the run failed; standard error:\n%s", failed, rep.Passed, err, stderr)
			}
		})
	}
}

// csi-sanity's node tests, run by plugd conformance --csi-sanity, against
// a CSI driver behind a registrar (testplugin's: node-driver-registrar and
// the hostpath driver are not served by the module proxy): a driver that
// validates its node requests passes csi/sanity-node, one that answers
// Unimplemented to every NodePublishVolume fails that check and only it.
// The driver has no controller service: the node test that creates a
// volume first is skipped, as a node plugin's author skips it.
func TestConformanceCSISanity(t *testing.T) {
	sanity := buildCSISanity(t)
	tp := filepath.Join(dirs.Bin, "testplugin")
	for _, tc := range []struct {
		name, driverFlags string
		fails             bool
	}{
		{"validates", "", false},
		{"no-validation", " --no-validation", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The driver and its registrar, as the two containers of a
			// node plugin's pod: the kit starts, signals and stops both.
			script := tp + ` csi --endpoint "$PLUGD_CONFORMANCE_ENDPOINT_DIR/csi.sock" --name csi.conformance.plugd.example.com --node-id node-1` + tc.driverFlags +
				` & exec ` + tp + ` registrar --csi-address "$PLUGD_CONFORMANCE_ENDPOINT_DIR/csi.sock" --plugin-registration-path "$PLUGD_CONFORMANCE_REGISTRY_DIR" --kubelet-registration-path "$PLUGD_CONFORMANCE_ENDPOINT_DIR/csi.sock"`
			cmd := exec.Command(filepath.Join(dirs.Bin, "plugd"), "conformance", "-o", "json", "--csi-sanity", sanity,
				"--csi-sanity-flag=--ginkgo.skip=should remove target path", "--", "/bin/sh", "-c", script)
			rep, stderr, err := readConformance(t, cmd, nil)
			var failed []string
			for _, c := range rep.Checks {
				if c.Status == "FAIL" {
					failed = append(failed, c.ID)
				}
				if c.ID == "csi/sanity-node" && c.Status != map[bool]string{false: "PASS", true: "FAIL"}[tc.fails] {
					t.Errorf("csi/sanity-node: %s: %s", c.Status, c.Seen)
				}
			}
			switch {
			case !tc.fails && (err != nil || !rep.Passed):
				t.Errorf("plugd conformance: %v, passed %t, failed %q; standard error:\n%s", err, rep.Passed, failed, stderr)
			case tc.fails && (len(failed) != 1 || failed[0] != "csi/sanity-node"):
				t.Errorf("failed %q, want csi/sanity-node only; standard error:\n%s", failed, stderr)
			}
			t.Logf("plugd conformance: %d checks in %s", len(rep.Checks), rep.Duration.Round(time.Millisecond))
		})
	}
}

// The CSI mock driver of the Kubernetes e2e tests (k8s.io/kubernetes
// v1.37.2 test/e2e/storage/drivers/csi-test, served by testplugin
// csi-mock) behind testplugin's registrar passes every check of plugd
// conformance, csi-sanity's node tests included: 19 of them run and pass,
// and csi-sanity skips the one that needs SINGLE_NODE_MULTI_WRITER, which
// the mock does not announce (csi-test v5.6.0 pkg/sanity/node.go). Unlike
// testplugin's own driver it has a controller service, so the node tests
// that create and publish a volume first run too, none skipped by us.
// Its node id is its driver name (mock/service/service.go New); its
// topology is its fixed segment (TopologyKey, TopologyValue).
func TestConformanceCSIMock(t *testing.T) {
	sanity := buildCSISanity(t)
	tp := filepath.Join(dirs.Bin, "testplugin")
	const name = "csi-mock.conformance.plugd.example.com"
	script := tp + ` csi-mock --endpoint "$PLUGD_CONFORMANCE_ENDPOINT_DIR/csi.sock" --name ` + name + ` --attach-limit 8 --enable-topology` +
		` & exec ` + tp + ` registrar --csi-address "$PLUGD_CONFORMANCE_ENDPOINT_DIR/csi.sock" --plugin-registration-path "$PLUGD_CONFORMANCE_REGISTRY_DIR" --kubelet-registration-path "$PLUGD_CONFORMANCE_ENDPOINT_DIR/csi.sock"`
	cmd := exec.Command(filepath.Join(dirs.Bin, "plugd"), "conformance", "-o", "json", "--csi-sanity", sanity, "--", "/bin/sh", "-c", script)
	rep := runConformance(t, cmd, nil)
	want := map[string]string{
		"csi/plugin-info": `"` + name + `", vendor version "0.3.0"`,
		"csi/node-info":   `node id "` + name + `", max volumes 8, topology map[io.kubernetes.storage.mock/node:some-mock-node]`,
		"csi/sanity-node": "Ran 19 of ",
	}
	for _, c := range rep.Checks {
		if c.Status != "PASS" {
			t.Errorf("%s: %s, want PASS: %s", c.ID, c.Status, c.Seen)
		}
		if w, ok := want[c.ID]; ok && !strings.Contains(c.Seen, w) {
			t.Errorf("%s saw %q; want it to say %q", c.ID, c.Seen, w)
		}
		delete(want, c.ID)
	}
	for id := range want {
		t.Errorf("%s: not in the report", id)
	}
	if rep.Duration > 30*time.Second {
		t.Errorf("the run took %s, more than 30 s", rep.Duration)
	}
}

// buildCSISanity builds csi-sanity, pinned by the module csisanity beside
// this file, into the binaries' directory.
func buildCSISanity(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(dirs.Bin, "csi-sanity")
	build := exec.Command("go", "build", "-o", bin, "github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity")
	build.Dir = filepath.Join(dirs.Module, "csisanity")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building csi-sanity: %v\n%s", err, out)
	}
	return bin
}
