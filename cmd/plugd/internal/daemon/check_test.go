package daemon_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/plugd/plugd/cmd/internal/version"
	"github.com/plugd/plugd/cmd/plugd/internal/daemon"
)

// plugd --check-config prints what plugd would run with and starts
// nothing; a configuration plugd refuses is an error naming the field.
func TestCheckConfig(t *testing.T) {
	dir := t.TempDir()
	check := func(config string, args ...string) (string, error) {
		path := filepath.Join(dir, "config.yaml")
		if err := os.WriteFile(path, []byte(config), 0o600); err != nil {
			t.Fatal(err)
		}
		cmd := daemon.Command()
		var out strings.Builder
		cmd.SetOut(&out)
		cmd.SetArgs(append([]string{"--check-config", "--config", path}, args...))
		err := cmd.ExecuteContext(context.Background())
		return out.String(), err
	}
	out, err := check("expect: [{type: CSIPlugin, name: csi.example.com}]\nlog: {format: json}\n", "--mode=observe", "--registry-dir", filepath.Join(dir, "reg"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg daemon.Config
	if err := yaml.UnmarshalStrict([]byte(out), &cfg); err != nil {
		t.Fatalf("--check-config printed what --config would not read: %v\n%s", err, out)
	}
	if cfg.Mode != "observe" || cfg.Log.Format != "json" || len(cfg.Expect) != 1 || cfg.Expect[0].Condition != "csi.example.com/CSIPluginReady" {
		t.Errorf("--check-config printed %+v", cfg)
	}
	if _, err := os.Stat(filepath.Join(dir, "reg")); !os.IsNotExist(err) {
		t.Errorf("--check-config created the registry directory: %v", err)
	}
	if _, err := check("expect: [{type: CSIPlugin, nmae: x}]\n"); err == nil || !strings.Contains(err.Error(), "unknown key expect[0].nmae") {
		t.Errorf("a misspelt field: %v", err)
	}
}

// Issue 33, item 12: plugd version prints its version as plugctl and
// kubectl plugd do (version.Line).
func TestVersionCommand(t *testing.T) {
	var out strings.Builder
	cmd := daemon.Command()
	cmd.SetArgs([]string{"version"})
	cmd.SetOut(&out)
	if err := cmd.Execute(); err != nil || out.String() != version.Line("plugd")+"\n" {
		t.Errorf("plugd version: %q, %v; want %q", out.String(), err, version.Line("plugd"))
	}
}

// Issue 33, item 12: a wrong command line exits 2, as plugctl's and
// kubectl plugd's do, with a hint at --help; an error of plugd running
// (a configuration it refuses) exits 1.
func TestExitCodes(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--bogus"}, daemon.ExitUsage, "unknown flag: --bogus"},
		{[]string{"extra"}, daemon.ExitUsage, `unknown command "extra"`},
		{[]string{"--workers", "many"}, daemon.ExitUsage, "invalid argument"},
		{[]string{"version", "x"}, daemon.ExitUsage, "unknown command"},
		{[]string{"--check-config", "--config", "/nonexistent/plugd.yaml"}, daemon.ExitError, "/nonexistent/plugd.yaml"},
	} {
		var stderr strings.Builder
		code := daemon.Execute(context.Background(), daemon.Command(), tc.args, &stderr)
		if code != tc.code || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("plugd %q: exit %d, want %d saying %q:\n%s", tc.args, code, tc.code, tc.want, stderr.String())
		}
		if hint := strings.Contains(stderr.String(), "--help' for usage"); hint != (tc.code == daemon.ExitUsage) {
			t.Errorf("plugd %q: a hint at --help %v:\n%s", tc.args, hint, stderr.String())
		}
	}
}
