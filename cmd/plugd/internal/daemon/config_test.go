package daemon

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/plugd/plugd/cmd/plugd/internal/kubenode"
	"github.com/plugd/plugd/internal/testenv"
)

// Issue 13, item 10 (the daemon's half): dangerous configurations are
// refused with a message that says why and what to do, from the file and
// from flags alike.
func TestDangerousConfigsRefused(t *testing.T) {
	dir := testenv.ShortDir(t, "pd")
	reg := filepath.Join(dir, "reg")
	if err := os.Mkdir(reg, 0o750); err != nil {
		t.Fatal(err)
	}
	for link, target := range map[string]string{"root": "/", "reglink": reg} {
		if err := os.Symlink(target, filepath.Join(dir, link)); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		// Every socket on the system would be dialled, every directory watched.
		{[]string{"--registry-dir", "/"}, "registryDir / is a system directory: plugd would watch every directory beneath it and dial every socket there"},
		{[]string{"--registry-dir", "/run"}, "registryDir /run is a system directory"},
		{[]string{"--registry-dir", "/etc/"}, "registryDir /etc is a system directory"},
		{[]string{"--registry-dir", filepath.Join(dir, "root")}, "(through symlinks, /) is a system directory"},
		{[]string{"--registry-dir", "/proc/self"}, "is in /proc, which holds the kernel's files"},
		{[]string{"--registry-dir", "/var/lib/kubelet"}, "is the kubelet's root directory"},
		// plugd would dial itself.
		{[]string{"--registry-dir", reg, "--status-socket", filepath.Join(reg, "plugd.sock")}, "status.socket " + reg + "/plugd.sock is inside registryDir " + reg + ": plugd would find its own status socket there"},
		{[]string{"--registry-dir", filepath.Join(dir, "reglink"), "--status-socket", filepath.Join(reg, "sub", "plugd.sock")}, "is inside registryDir"},
		// A name is not trusted to mean loopback.
		{[]string{"--status-tcp", "plugd.example.com:9090"}, "without status.allowNonLoopback it must be a loopback IP address"},
		// Floors and ceilings.
		{[]string{"--probe-interval", "1ns"}, "liveness.probeInterval is 1ns: it must be at least 100ms and at most 24h0m0s"},
		{[]string{"--backoff-initial", "1ns"}, "backoff.initial is 1ns: it must be at least 10ms"},
		{[]string{"--backoff-max", "1000h"}, "backoff.max is 1000h0m0s: it must be at least 10ms and at most 1h0m0s"},
		{[]string{"--workers", "1000000"}, "workers is 1000000: it must be from 1 to 1024"},
		{[]string{"--max-sockets", "10000000"}, "policy.maxSockets is 10000000: it must be from 1 to 100000"},
		{[]string{"--dial-timeout", "1000h"}, "timeouts.dial is 1000h0m0s: it must be at least 10ms and at most 5m0s"},
		{[]string{"--get-info-timeout", "1ns"}, "timeouts.getInfo is 1ns"},
		{[]string{"--notify-timeout", "1ns"}, "timeouts.notify is 1ns"},
		{[]string{"--handler-timeout", "1ns"}, "timeouts.handler is 1ns"},
		{[]string{"--shutdown-timeout", "1ns"}, "shutdownTimeout is 1ns: it must be at least 100ms"},
		{[]string{"--resync-interval", "1000h"}, "resyncInterval is 1000h0m0s: it must be at least 1s and at most 24h0m0s (default 30s), or negative, which disables"},
		{[]string{"--unhealthy-grace", "1000h"}, "liveness.unhealthyGrace is 1000h0m0s"},
		{[]string{"--remove-stale-after", "1ms"}, "policy.removeStaleAfter is 1ms: it must be at least 1s"},
	} {
		_, err := LoadArgs(tc.args, func(string) string { return "" })
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("plugd %q: error %v, want it to say %q", tc.args, err, tc.want)
		}
	}

	// What is accepted: negative still disables, localhost is 127.0.0.1
	// without asking /etc/hosts, a socket beside the directory is fine.
	cfg, err := LoadArgs([]string{"--registry-dir", reg, "--status-socket", filepath.Join(dir, "plugd.sock"),
		"--status-tcp", "localhost:9090", "--probe-interval", "-1s", "--resync-interval", "-1s"}, func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Status.TCP != "127.0.0.1:9090" {
		t.Errorf("status.tcp localhost:9090 is %q, want 127.0.0.1:9090", cfg.Status.TCP)
	}

	// A negative grace keeps an Unhealthy plugin registered for ever, as
	// the kubelet does (pluginmanager's negative UnhealthyGrace), for every
	// type or for one.
	path := filepath.Join(dir, "c.yaml")
	if err := os.WriteFile(path, []byte("liveness: {unhealthyGrace: -1s}\nhandlers: [{type: CSIPlugin, handler: accept, unhealthyGrace: -1s}, {type: X, handler: accept}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err = LoadArgs([]string{"--config", path, "--registry-dir", reg}, func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	if o := cfg.managerOptions(nil, nil); o.UnhealthyGrace >= 0 {
		t.Errorf("liveness.unhealthyGrace -1s reaches the manager as %s, want negative", o.UnhealthyGrace)
	}
	if o := cfg.handlerOptions(cfg.Handlers[0]); o.UnhealthyGrace >= 0 {
		t.Errorf("handlers[0].unhealthyGrace -1s reaches the manager as %s, want negative", o.UnhealthyGrace)
	}

	// In the file, and for a handler's own settings.
	for _, tc := range []struct{ yaml, want string }{
		{"handlers: [{type: DRAPlugin, handler: dra, gracePeriod: 1ns}]\n", "handlers[0]: gracePeriod is 1ns: it must be at least 10ms"},
		{"handlers: [{type: X, handler: accept, unhealthyGrace: 1000h}]\n", "handlers[0]: unhealthyGrace is 1000h0m0s"},
		{"handlers: [{type: X, handler: hook, hook: {command: [/bin/true], timeout: 1ns}}]\n", "handlers[0]: hook.timeout is 1ns"},
		{"kubernetes: {nodeName: n, disagreementGrace: 1ms}\n", "kubernetes.disagreementGrace is 1ms: it must be at least 1s"},
	} {
		if err := os.WriteFile(path, []byte(tc.yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := LoadArgs([]string{"--config", path}, func(string) string { return "" })
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want it to say %q", tc.yaml, err, tc.want)
		}
	}
}

// WithDefaults fills in every numeric default from bounds.go's tables, on a
// copy: the caller's handlers and hooks keep their zeros.
func TestDefaultsAppliedToACopy(t *testing.T) {
	in := Config{RegistryDir: "/x", Handlers: []HandlerConfig{
		{Type: "DRAPlugin", Handler: "dra"},
		{Type: "example.com/Greeter", Handler: "hook", Hook: &HookConfig{Command: []string{"/bin/true"}}},
		{Type: "CSIPlugin", Handler: "csi"},
	}, Kubernetes: &KubernetesConfig{NodeName: "n"}}
	c, err := in.WithDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if c.Workers != 128 || c.Timeouts.Handler != Duration(30*time.Second) || c.Policy.MaxSockets != 20000 ||
		c.Policy.RemoveStaleAfter != 0 || c.Kubernetes.DisagreementGrace != Duration(time.Minute) {
		t.Errorf("defaults not applied: %+v", c)
	}
	if c.Handlers[0].GracePeriod != Duration(30*time.Second) || c.Handlers[1].Hook.Timeout != Duration(10*time.Second) ||
		c.Handlers[2].GracePeriod != 0 || c.Handlers[0].UnhealthyGrace != 0 {
		t.Errorf("handlers' defaults: %+v, hook %+v", c.Handlers, c.Handlers[1].Hook)
	}
	if in.Handlers[0].GracePeriod != 0 || in.Handlers[1].Hook.Timeout != 0 || in.Kubernetes.DisagreementGrace != 0 {
		t.Errorf("WithDefaults wrote into the caller's configuration: %+v, hook %+v", in.Handlers, in.Handlers[1].Hook)
	}
	if again, err := c.WithDefaults(); err != nil || !reflect.DeepEqual(again, c) {
		t.Errorf("WithDefaults of its own result: %v\n%+v\n%+v", err, again, c)
	}
}

// An entry with anyOf names a resource: no type of its own, the condition
// NAME/Ready, each alternative's defaults filled in; WithDefaults of its
// result is the same; the node agent gets it as one expectation of type
// anyOf.
func TestExpectAnyOf(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(path, []byte("expect:\n- name: gpu.example.com\n  taint: example.com/gpu-not-ready:NoSchedule\n  retaint: true\n"+
		"  anyOf: [{type: DevicePlugin, name: example.com/gpu}, {type: DRAPlugin, name: gpu.example.com}]\nkubernetes: {nodeName: n}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	in, err := LoadConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	c, err := in.WithDefaults()
	if err != nil {
		t.Fatal(err)
	}
	want := ExpectConfig{Name: "gpu.example.com", Condition: "gpu.example.com/Ready", Taint: "example.com/gpu-not-ready:NoSchedule", Retaint: true,
		AnyOf: []ExpectConfig{{Type: "DevicePlugin", Name: "example.com/gpu", MinHealthyDevices: 1}, {Type: "DRAPlugin", Name: "gpu.example.com", MinDevices: 1}}}
	if len(c.Expect) != 1 || !reflect.DeepEqual(c.Expect[0], want) {
		t.Errorf("expect %+v; want %+v", c.Expect, want)
	}
	if again, err := c.WithDefaults(); err != nil || !reflect.DeepEqual(again.Expect, c.Expect) {
		t.Errorf("WithDefaults of its own result: %v\n%+v", err, again.Expect)
	}
	if x := c.Expect[0].expectation(); x.Type != "" || len(x.AnyOf) != 2 {
		t.Errorf("the node agent's expectation %+v", x)
	} else if x, err := x.WithDefaults(); err != nil || x.Type != kubenode.TypeAnyOf {
		t.Errorf("the node agent's expectation %+v, %v; want type %s", x, err, kubenode.TypeAnyOf)
	}
}

// Issue 34: an expected DRA driver's deviceClasses survive loading and
// defaults, reach the node agent's expectation, and are not shared with the
// caller's configuration.
func TestDeviceClassesKept(t *testing.T) {
	path := filepath.Join(testenv.ShortDir(t, "pd"), "c.yaml")
	yaml := "expect: [{type: DRAPlugin, name: gpu.example.com, deviceClasses: [gpu.example.com, fast.gpu.example.com]}]\nkubernetes: {nodeName: node-a}\n"
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	in, err := LoadConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	c, err := in.WithDefaults()
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"gpu.example.com", "fast.gpu.example.com"}
	if got := c.Expect[0].DeviceClasses; !reflect.DeepEqual(got, want) {
		t.Fatalf("deviceClasses after defaults: %q, want %q", got, want)
	}
	if got := c.Expect[0].expectation().DeviceClasses; !reflect.DeepEqual(got, want) {
		t.Errorf("the expectation's DeviceClasses: %q, want %q", got, want)
	}
	c.Expect[0].DeviceClasses[0] = "changed.example.com"
	if in.Expect[0].DeviceClasses[0] != "gpu.example.com" {
		t.Errorf("WithDefaults' result shares deviceClasses with the caller's configuration")
	}
}
