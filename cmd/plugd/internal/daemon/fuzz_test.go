package daemon

import (
	"bytes"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/plugd/plugd/internal/testenv"
	"github.com/plugd/plugd/pluginmanager"
)

// sameConfig reports whether a and b are equal but for empty slices, which
// may be nil in one and not the other: the one difference between a
// configuration and its YAML round trip that is not a bug. An empty list
// ("handlers: []") is left out when written, and read back as nil; both
// mean the same, the default.
func sameConfig(a, b Config) bool {
	return sameValue(reflect.ValueOf(a), reflect.ValueOf(b))
}

func sameValue(a, b reflect.Value) bool {
	switch a.Kind() {
	case reflect.Slice:
		if a.Len() != b.Len() {
			return false
		}
		for i := range a.Len() {
			if !sameValue(a.Index(i), b.Index(i)) {
				return false
			}
		}
		return true
	case reflect.Pointer:
		if a.IsNil() || b.IsNil() {
			return a.IsNil() == b.IsNil()
		}
		return sameValue(a.Elem(), b.Elem())
	case reflect.Struct:
		for i := range a.NumField() {
			if !sameValue(a.Field(i), b.Field(i)) {
				return false
			}
		}
		return true
	case reflect.Map:
		if a.Len() != b.Len() {
			return false
		}
		for _, k := range a.MapKeys() {
			if v := b.MapIndex(k); !v.IsValid() || !sameValue(a.MapIndex(k), v) {
				return false
			}
		}
		return true
	}
	return reflect.DeepEqual(a.Interface(), b.Interface())
}

// yamlCannotWrite reports whether c holds a string that sigs.k8s.io/yaml.Marshal
// cannot write faithfully. Marshal converts the JSON form to YAML by parsing
// that JSON as YAML 1.1, whose reader refuses some characters raw ("yaml:
// control characters are not allowed": DEL, the C1 controls, U+FFFE, U+FFFF)
// and takes a raw NEL (U+0085) in a quoted string for a line break, folded to
// a space; encoding/json leaves all of them unescaped. A configuration can
// hold them (as YAML escapes, "\x7f"), but cannot be written back: a limit of
// the YAML library, not of plugd, so the round trip is not checked for them.
func yamlCannotWrite(t *testing.T, c Config) bool {
	t.Helper()
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatalf("json.Marshal(%+v): %v", c, err)
	}
	return bytes.ContainsFunc(b, func(r rune) bool {
		return r == 0x7f || r >= 0x80 && r <= 0x9f || r == 0xfffe || r == 0xffff
	})
}

// loadBytes writes b to path and loads it, failing the test if LoadConfig
// has not returned within testenv.Timeout: a hang guard, not a speed claim
// (a real configuration loads in well under a millisecond; only a
// pathological parse, a YAML alias bomb, would come near).
func loadBytes(t *testing.T, path string, b []byte) (Config, error) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	type loaded struct {
		c   Config
		err error
	}
	done := make(chan loaded, 1)
	go func() {
		c, err := LoadConfig(path)
		done <- loaded{c, err}
	}()
	select {
	case l := <-done:
		return l.c, l.err
	case <-time.After(testenv.Timeout):
		t.Fatalf("LoadConfig did not return within %v on %d bytes", testenv.Timeout, len(b))
		return Config{}, nil
	}
}

// checkConfig checks what WithDefaults promises of a configuration it accepts.
func checkConfig(t *testing.T, c Config) {
	t.Helper()
	if !filepath.IsAbs(c.RegistryDir) {
		t.Errorf("registryDir %q is not absolute", c.RegistryDir)
	}
	if len(c.Handlers) == 0 {
		t.Errorf("no handlers")
	}
	types := map[string]bool{}
	for i, h := range c.Handlers {
		if h.Type == "" || types[h.Type] {
			t.Errorf("handlers[%d].type %q is empty or repeated", i, h.Type)
		}
		types[h.Type] = true
		if !slices.Contains(builtinHandlers, h.Handler) {
			t.Errorf("handlers[%d].handler %q is not a built-in", i, h.Handler)
		}
		if (h.Handler == "hook") != (h.Hook != nil) {
			t.Errorf("handlers[%d]: handler %q with hook %+v", i, h.Handler, h.Hook)
		}
		if h.GracePeriod < 0 || h.GracePeriod != 0 && h.Handler != "dra" && h.Handler != "deviceplugin" {
			t.Errorf("handlers[%d]: gracePeriod %s with handler %q", i, h.GracePeriod, h.Handler)
		}
		if h.UnhealthyGrace > 0 && h.UnhealthyGrace < Duration(minDuration) { // negative: for ever
			t.Errorf("handlers[%d].unhealthyGrace is %s", i, h.UnhealthyGrace)
		}
		if h.Hook != nil && h.Hook.Timeout < 0 {
			t.Errorf("handlers[%d].hook.timeout is %s", i, h.Hook.Timeout)
		}
	}
	if c.Status.Socket == "" {
		t.Errorf("status.socket is empty")
	}
	if c.Status.TCP != "" {
		host, _, err := net.SplitHostPort(c.Status.TCP)
		if err != nil {
			t.Errorf("status.tcp %q: %v", c.Status.TCP, err)
		} else if ip := net.ParseIP(host); !c.Status.AllowNonLoopback && host != "localhost" && (ip == nil || !ip.IsLoopback()) {
			t.Errorf("status.tcp %q is not loopback, and allowNonLoopback is off", c.Status.TCP)
		}
	}
	if c.Workers < 0 {
		t.Errorf("workers is %d", c.Workers)
	}
	if c.ShutdownTimeout <= 0 {
		t.Errorf("shutdownTimeout is %s", c.ShutdownTimeout)
	}
	if c.ResyncInterval > 0 && c.ResyncInterval < Duration(time.Second) {
		t.Errorf("resyncInterval is %s", c.ResyncInterval)
	}
	for name, d := range map[string]Duration{
		"backoff.initial": c.Backoff.Initial, "backoff.max": c.Backoff.Max,
		"timeouts.dial": c.Timeouts.Dial, "timeouts.getInfo": c.Timeouts.GetInfo,
		"timeouts.notify": c.Timeouts.Notify, "timeouts.handler": c.Timeouts.Handler,
	} {
		if d < 0 {
			t.Errorf("%s is %s", name, d)
		}
	}
	if g := c.Liveness.UnhealthyGrace; g == 0 || g > 0 && g < Duration(minDuration) { // negative: for ever
		t.Errorf("liveness.unhealthyGrace is %s", g)
	}
	if c.Policy.RemoveStaleAfter < 0 {
		t.Errorf("policy.removeStaleAfter is %s", c.Policy.RemoveStaleAfter)
	}
	if c.Policy.MaxSockets < 0 {
		t.Errorf("policy.maxSockets is %d", c.Policy.MaxSockets)
	}
	for i, root := range c.Policy.EndpointRoots {
		if !filepath.IsAbs(root) {
			t.Errorf("policy.endpointRoots[%d] %q is not absolute", i, root)
		}
	}
	peerTypes := map[string]bool{}
	for i, r := range c.Policy.AllowedPeers {
		if r.Type == "" || peerTypes[r.Type] || len(r.UIDs) == 0 && len(r.GIDs) == 0 {
			t.Errorf("policy.allowedPeers[%d] %+v is empty, or its type repeated", i, r)
		}
		peerTypes[r.Type] = true
	}
	if c.Log.Format != "text" && c.Log.Format != "json" {
		t.Errorf("log.format is %q", c.Log.Format)
	}
	if _, err := parseLevel(c.Log.Level); err != nil {
		t.Errorf("log.level: %v", err)
	}
	if _, err := pluginmanager.New(c.managerOptions(nil, nil)); err != nil {
		t.Errorf("the manager refuses an accepted configuration: %v", err)
	}
}

// FuzzConfig feeds arbitrary bytes to the configuration file parser, and
// checks what it accepts: LoadConfig and WithDefaults never panic or hang,
// refuse with a message, and what they accept is within bounds, survives a
// YAML round trip unchanged, and is a fixed point of WithDefaults.
func FuzzConfig(f *testing.F) {
	example, err := os.ReadFile(filepath.Join("..", "..", "..", "..", "deploy", "systemd", "config.yaml"))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(example)
	f.Add([]byte(""))
	f.Add([]byte("workers: 4\n"))
	f.Add([]byte("handlers:\n- type: CSIPlugin\n  handler: csi\n- type: DRAPlugin\n  handler: dra\n  gracePeriod: 1m\n- type: DevicePlugin\n  handler: deviceplugin\n"))
	f.Add([]byte("handlers:\n- type: example.com/Greeter\n  handler: hook\n  hook:\n    command: [sh, -c, 'exit 0']\n    events: [validate, register, deregister]\n    timeout: 10s\n    env: [A=b]\n"))
	f.Add([]byte("handlers:\n- type: example.com/Greeter\n  handler: hook\n  hook: {url: 'https://admit.example.com/hook?token=x'}\n"))
	f.Add([]byte("workerz: 4\n"))
	f.Add([]byte("resyncInterval: 5\n"))
	f.Add([]byte("resyncInterval: 100ms\nbackoff: {initial: 5m}\n"))
	f.Add([]byte("shutdownTimeout: -1s\ntimeouts: {dial: 1h30m}\n"))
	f.Add([]byte("status: {tcp: '0.0.0.0:9090'}\n"))
	f.Add([]byte("policy:\n  endpointRoots: [/run/csi]\n  allowedPeers: [{type: '*', uids: [0]}]\n  maxSockets: 10\nliveness: {probeInterval: -1s}\n"))
	f.Add([]byte("handlers: [{type: DRAPlugin, handler: dra, unhealthyGrace: 2m}]\n"))
	f.Add([]byte("registryDir: \"/a\\x7f\\x85\\ufffe\"\n"))
	f.Add([]byte("a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\nc: [*b, *b, *b, *b, *b, *b, *b, *b, *b]\n"))

	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(dir, "config.yaml")
		raw, err := loadBytes(t, path, data)
		if err != nil {
			if err.Error() == "" {
				t.Errorf("LoadConfig failed with an empty message")
			}
			return
		}

		// What was read is written back as the same configuration.
		roundTrip := !yamlCannotWrite(t, raw)
		if roundTrip {
			out, err := yaml.Marshal(raw)
			if err != nil {
				t.Fatalf("Marshal(%+v): %v", raw, err)
			}
			back, err := loadBytes(t, path, out)
			if err != nil {
				t.Fatalf("the configuration does not load once written:\n%s\n%v", out, err)
			}
			if !sameConfig(back, raw) {
				t.Errorf("the configuration changed in a round trip through:\n%s\nread  %+v\nthen  %+v", out, raw, back)
			}
		}

		c, err := raw.WithDefaults()
		if err != nil {
			if err.Error() == "" {
				t.Errorf("WithDefaults failed with an empty message")
			}
			return
		}
		checkConfig(t, c)

		// Defaults are a fixed point, before and after a round trip.
		again, err := c.WithDefaults()
		if err != nil {
			t.Fatalf("WithDefaults refuses its own result %+v: %v", c, err)
		}
		if !reflect.DeepEqual(again, c) {
			t.Errorf("WithDefaults is not idempotent:\nonce  %+v\ntwice %+v", c, again)
		}
		if !roundTrip {
			return
		}
		out, err := yaml.Marshal(c)
		if err != nil {
			t.Fatalf("Marshal(%+v): %v", c, err)
		}
		back, err := loadBytes(t, path, out)
		if err != nil {
			t.Fatalf("the configuration with defaults does not load once written:\n%s\n%v", out, err)
		}
		if back, err = back.WithDefaults(); err != nil {
			t.Fatalf("the configuration with defaults is refused once written:\n%s\n%v", out, err)
		}
		if !sameConfig(back, c) {
			t.Errorf("the configuration with defaults changed in a round trip through:\n%s\nread  %+v\nthen  %+v", out, c, back)
		}
	})
}
