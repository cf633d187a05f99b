package daemon

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

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
		"# FIELD CHECK<tab>EXAMPLE (a configuration that breaks it, as JSON)<tab>WHAT PLUGD SAYS.\n" +
		"# TestSchemaCoversConfigRules holds the chart's schema to them.\n" +
		"# Written by: go test ./cmd/plugd/internal/daemon -run TestConfigRules -update\n")
	seen := map[string]bool{}
	for _, r := range configRules() {
		if seen[r.name()] {
			t.Errorf("two rules are named %q", r.name())
		}
		seen[r.name()] = true
		example, err := yaml.YAMLToJSON([]byte(r.example))
		if err != nil {
			t.Fatalf("rule %q: %v", r.name(), err)
		}
		list.WriteString(r.name() + "\t" + string(example) + "\t" + r.says + "\n")
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

// refusalSites are the functions that refuse a configuration, and how many
// errors each makes (errors.New and fmt.Errorf calls, wrappers included)
// when configRules was last brought up to date with them. A new refusal
// fails TestConfigRulesUpToDate until it has its rule in configRules and
// its count here.
var refusalSites = []struct {
	file, fn string
	errors   int
}{
	{"config.go", "WithDefaults", 3},
	{"config.go", "withDefaults", 2}, // DoctorConfig's
	{"config.go", "checkHandlers", 4},
	{"config.go", "check", 5}, // PolicyConfig's
	{"config.go", "checkKubernetes", 7},
	{"config.go", "checkExpect", 4},
	{"config.go", "uniqueExpect", 1},
	{"config.go", "parseLevel", 1},
	{"handlers.go", "checkHandler", 3},
	{"paths.go", "checkRegistryDir", 3},
	{"paths.go", "checkStatusSocket", 1},
	{"paths.go", "statusTCP", 3},
	{"bounds.go", "check", 2},
	{"../kubenode/conditions.go", "WithDefaults", 11},
	{"../kubenode/conditions.go", "checkDeviceClasses", 3},
	{"../kubenode/taints.go", "taintRules", 5},
	{"../kubenode/conditions.go", "DefaultCondition", 1},
	{"../kubenode/conditions.go", "ParseTaint", 4},
	{"../kubenode/anyof.go", "withAlternatives", 8},
}

// The refusals in the code are the ones configRules was written for: a
// rule added to the code without its line in configRules fails here.
func TestConfigRulesUpToDate(t *testing.T) {
	fset := token.NewFileSet()
	for _, s := range refusalSites {
		f, err := parser.ParseFile(fset, s.file, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Name.Name != s.fn {
				continue
			}
			ast.Inspect(fd, func(x ast.Node) bool {
				if c, ok := x.(*ast.CallExpr); ok {
					if sel, ok := c.Fun.(*ast.SelectorExpr); ok {
						if id, ok := sel.X.(*ast.Ident); ok && (id.Name == "errors" && sel.Sel.Name == "New" || id.Name == "fmt" && sel.Sel.Name == "Errorf") {
							n++
						}
					}
				}
				return true
			})
		}
		if n != s.errors {
			t.Errorf("%s %s makes %d errors, configRules was written for %d: give a new refusal its rule in configRules (rules.go), then set the count in refusalSites", s.file, s.fn, n, s.errors)
		}
	}
}
