//go:build linux

package kube

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

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
	cmd := exec.Command(filepath.Join(dirs.Bin, "plugd"), append([]string{"conformance", "-o", "json"}, args...)...)
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
	if err != nil || !rep.Passed {
		t.Fatalf("plugd conformance: %v, passed %t; standard error:\n%s", err, rep.Passed, stderr.String())
	}
	t.Logf("plugd conformance: %d checks in %s", len(rep.Checks), rep.Duration.Round(time.Millisecond))
	return rep
}

// The kubelet's own sample device plugin (k8s.io/kubernetes
// test/images/sample-device-plugin, built on the device manager's stub)
// passes every required check of plugd conformance, started by it: its
// socket goes in PLUGIN_SOCK_DIR, which the kit sets to its registry
// directory, and REGISTER_CONTROL_FILE keeps it from registering with a
// kubelet socket that is not there.
func TestConformanceSampleDevicePlugin(t *testing.T) {
	bin := filepath.Join(dirs.Bin, "sample-device-plugin")
	build := exec.Command("go", "build", "-o", bin, "k8s.io/kubernetes/test/images/sample-device-plugin")
	build.Dir = dirs.Module
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the sample device plugin: %v\n%s", err, out)
	}
	control := filepath.Join(t.TempDir(), "register")
	rep := conformance(t, []string{"REGISTER_CONTROL_FILE=" + control}, "--registry-env=PLUGIN_SOCK_DIR", "--", bin)
	if rep.Duration > 30*time.Second {
		t.Errorf("the run took %s, more than 30 s", rep.Duration)
	}
}

// The device manager's stub itself, run in this process, passes every
// required check with plugd conformance attached to it.
func TestConformanceDevicePluginStub(t *testing.T) {
	dir := testenv.ShortDir(t, "reg")
	devs := []*dpapi.Device{{ID: "Dev-1", Health: dpapi.Healthy}, {ID: "Dev-2", Health: dpapi.Healthy}}
	logger := klog.Background()
	stub := dpstub.NewDevicePluginStub(logger, devs, filepath.Join(dir, "stub.sock"), "example.com/stub", false, false)
	if err := stub.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stub.Stop(logger) })
	rep := conformance(t, nil, "--registry-dir", dir)
	for _, c := range rep.Checks {
		if c.Status == "FAIL" {
			t.Errorf("%s failed: %s", c.ID, c.Seen)
		}
	}
}
