package daemon

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/plugd/plugd/internal/testenv"
)

// rulesFile is the list of configRules that test/deploy holds the chart's
// schema to: its module cannot import this package.
const rulesFile = "test/deploy/testdata/config-rules.txt"

// Every rule of configRules is one plugd enforces: its example is refused
// with an error that says what the rule says; the names are unique; and
// test/deploy's copy of the list is this one (-update writes it).
func TestConfigRules(t *testing.T) {
	dir := testenv.ShortDir(t, "pd")
	var list strings.Builder
	list.WriteString("# plugd's configuration rules (cmd/plugd/internal/daemon/rules.go), one a line:\n" +
		"# FIELD CHECK. TestSchemaCoversConfigRules holds the chart's schema to them.\n" +
		"# Written by: go test ./cmd/plugd/internal/daemon -run TestConfigRules -update\n")
	seen := map[string]bool{}
	for _, r := range configRules() {
		if seen[r.name()] {
			t.Errorf("two rules are named %q", r.name())
		}
		seen[r.name()] = true
		list.WriteString(r.name() + "\n")
		path := filepath.Join(dir, "c.yaml")
		if err := os.WriteFile(path, []byte(r.example), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg, err := LoadConfig(path)
		if err == nil {
			_, err = cfg.WithDefaults()
		}
		if err == nil || !strings.Contains(err.Error(), r.says) {
			t.Errorf("rule %q: %q is refused with %v; want an error that says %q", r.name(), r.example, err, r.says)
		}
	}
	// Every numeric setting has its range rule.
	for _, s := range durationSettings {
		if !seen[s.field+" range"] {
			t.Errorf("%s has no range rule", s.field)
		}
	}
	if !slices.ContainsFunc(configRules(), func(r configRule) bool { return r.field == "handlers[].probeInterval" }) {
		t.Error("the handlers' durations have no rules")
	}
	path := filepath.Join(testenv.Root(), filepath.FromSlash(rulesFile))
	if *updateReference {
		if err := os.WriteFile(path, []byte(list.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	if b, err := os.ReadFile(path); err != nil || string(b) != list.String() {
		t.Errorf("%s is not configRules (%v): go test ./cmd/plugd/internal/daemon -run TestConfigRules -update", rulesFile, err)
	}
}
