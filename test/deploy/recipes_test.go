package deploy

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// recipesWanted are the recipes issue 32 asks docs/cluster.md for: the
// drivers whose own startup-taint removers plugd replaces, a GPU device
// plugin, the autoscalers and managed clusters, and node-readiness-controller
// in both modes.
var recipesWanted = []string{"aws-ebs", "aws-efs", "aws-fsx-lustre", "mountpoint-s3", "secrets-store", "gpu-device-plugin",
	"karpenter", "cluster-autoscaler", "gke", "aks", "node-readiness-bootstrap-only", "node-readiness-continuous"}

// recipeLink is a link from docs/cluster.md to a recipe's values file.
var recipeLink = regexp.MustCompile(`\]\((recipes/([a-z0-9-]+)\.yaml)\)`)

// The recipes of docs/cluster.md: every one it links is a values file in
// docs/recipes that the chart renders (its schema checks the values) and
// whose configuration plugd --check-config takes, as the DaemonSet runs
// it; every file there is linked; and the taints plugd would remove are
// exactly those the chart lets it write (the admission policy's
// parameter). A node-readiness-controller recipe names no taint of the
// key its NodeReadinessRule owns (one owner per key), and expects the
// plugins whose conditions that rule waits for.
func TestRecipes(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join(repo, "docs", "cluster.md"))
	if err != nil {
		t.Fatal(err)
	}
	linked := map[string]string{}
	for _, m := range recipeLink.FindAllStringSubmatch(string(doc), -1) {
		linked[m[2]] = m[1]
	}
	for _, name := range recipesWanted {
		if linked[name] == "" {
			t.Errorf("docs/cluster.md links no recipe %s (docs/recipes/%s.yaml)", name, name)
		}
	}
	files, err := filepath.Glob(filepath.Join(repo, "docs", "recipes", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if name := strings.TrimSuffix(filepath.Base(f), ".yaml"); linked[name] == "" {
			t.Errorf("docs/recipes/%s.yaml: docs/cluster.md does not link it", name)
		}
	}
	for name, rel := range linked {
		t.Run(name, func(t *testing.T) {
			values, err := os.ReadFile(filepath.Join(repo, "docs", rel))
			if err != nil {
				t.Fatalf("docs/cluster.md links %s: %v", rel, err)
			}
			m, _, err := render(t, string(values))
			if err != nil {
				t.Fatalf("the chart with docs/%s: %v", rel, err)
			}
			o := decode(t, m)
			cfg, err := runConfig(t, o)
			if err != nil {
				t.Fatalf("docs/%s: %v", rel, err)
			}
			taints, conditions := recipeTaints(t, cfg)
			var allowed []string
			for _, c := range o.configMaps {
				if c.Name == "plugd-remove-taint" {
					allowed = strings.Fields(c.Data["taints"])
				}
			}
			slices.Sort(allowed)
			if !slices.Equal(taints, allowed) {
				t.Errorf("docs/%s: plugd removes %q; the admission policy lets it write %q", rel, taints, allowed)
			}
			if mode, ok := strings.CutPrefix(name, "node-readiness-"); ok {
				checkReadinessRecipe(t, mode, taints, conditions)
			}
		})
	}
}

// recipeTaints are the taints (KEY:EFFECT) of plugd's configuration cfg,
// sorted and each once, and the conditions it writes.
func recipeTaints(t *testing.T, cfg map[string]any) (taints, conditions []string) {
	t.Helper()
	b, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		Expect []struct {
			Taint, Condition string
		}
		Kubernetes struct{ RemoveTaintWhenReady string }
	}
	if err := yaml.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	if c.Kubernetes.RemoveTaintWhenReady != "" {
		taints = append(taints, c.Kubernetes.RemoveTaintWhenReady)
	}
	for _, e := range c.Expect {
		if e.Taint != "" {
			taints = append(taints, e.Taint)
		}
		conditions = append(conditions, e.Condition)
	}
	slices.Sort(taints)
	return slices.Compact(taints), conditions
}

// checkReadinessRecipe holds a node-readiness-controller recipe of mode
// against deploy/node-readiness/MODE.yaml: plugd names no taint of the
// rule's key, and writes every condition the rule waits for.
func checkReadinessRecipe(t *testing.T, mode string, taints, conditions []string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repo, "deploy", "node-readiness", mode+".yaml"))
	if err != nil {
		t.Fatalf("the recipe's rule: %v", err)
	}
	var r nodeReadinessRule
	if err := yaml.UnmarshalStrict(b, &r); err != nil {
		t.Fatal(err)
	}
	if r.Spec.EnforcementMode != mode {
		t.Errorf("deploy/node-readiness/%s.yaml is %s", mode, r.Spec.EnforcementMode)
	}
	for _, tt := range taints {
		if strings.HasPrefix(tt, r.Spec.Taint.Key+":") {
			t.Errorf("plugd removes %s, which the NodeReadinessRule %s owns: one owner per key", tt, r.Name)
		}
	}
	for _, c := range r.Spec.Conditions {
		if !slices.Contains(conditions, c.Type) {
			t.Errorf("the NodeReadinessRule %s waits for %s, which plugd does not write with this recipe (it writes %q)", r.Name, c.Type, conditions)
		}
	}
}
