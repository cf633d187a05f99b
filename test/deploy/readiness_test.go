package deploy

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"
)

// nodeReadinessRule is node-readiness-controller's NodeReadinessRule
// (readiness.node.x-k8s.io/v1alpha1) as its API documents it: the fields
// of its spec, decoded strictly, so that a field it does not have fails.
type nodeReadinessRule struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Conditions []struct {
			Type           string                 `json:"type"`
			RequiredStatus corev1.ConditionStatus `json:"requiredStatus"`
		} `json:"conditions"`
		EnforcementMode string               `json:"enforcementMode"`
		Taint           corev1.Taint         `json:"taint"`
		NodeSelector    metav1.LabelSelector `json:"nodeSelector"`
		DryRun          bool                 `json:"dryRun,omitempty"`
	} `json:"spec"`
}

// The NodeReadinessRule examples are valid for the controller's v1alpha1
// API (what its CRD's schema and its admission webhook require), and each
// condition they wait for is the one plugd writes for the expect list their
// comment gives, as plugd itself names it.
func TestNodeReadinessRules(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(repo, "deploy", "node-readiness", "*.yaml"))
	if err != nil || len(files) < 2 {
		t.Fatalf("the examples: %v %v", files, err)
	}
	modes := map[string]bool{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		name := filepath.Base(f)
		var r nodeReadinessRule
		if err := yaml.UnmarshalStrict(b, &r); err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		s := r.Spec
		if r.APIVersion != "readiness.node.x-k8s.io/v1alpha1" || r.Kind != "NodeReadinessRule" {
			t.Errorf("%s: %s %s", name, r.APIVersion, r.Kind)
		}
		if errs := validation.IsDNS1123Subdomain(r.Name); len(errs) > 0 || r.Namespace != "" {
			t.Errorf("%s: name %q (%v), namespace %q: the kind is cluster-scoped", name, r.Name, errs, r.Namespace)
		}
		if n := len(s.Conditions); n < 1 || n > 32 {
			t.Errorf("%s: %d conditions, want 1 to 32", name, n)
		}
		var types []string
		for _, c := range s.Conditions {
			if c.Type == "" || len(c.Type) > 316 || slices.Contains(types, c.Type) {
				t.Errorf("%s: condition type %q: empty, too long or repeated", name, c.Type)
			}
			if c.RequiredStatus != corev1.ConditionTrue && c.RequiredStatus != corev1.ConditionFalse && c.RequiredStatus != corev1.ConditionUnknown {
				t.Errorf("%s: requiredStatus %q", name, c.RequiredStatus)
			}
			types = append(types, c.Type)
		}
		sel, err := metav1.LabelSelectorAsSelector(&s.NodeSelector)
		if err != nil || sel.Empty() {
			t.Errorf("%s: nodeSelector %v: the webhook refuses an invalid or empty one (%v)", name, s.NodeSelector, err)
		}
		if errs := validation.IsQualifiedName(s.Taint.Key); len(errs) > 0 {
			t.Errorf("%s: taint key %q: %v", name, s.Taint.Key, errs)
		}
		switch s.Taint.Effect {
		case corev1.TaintEffectNoSchedule, corev1.TaintEffectPreferNoSchedule, corev1.TaintEffectNoExecute:
		default:
			t.Errorf("%s: taint effect %q", name, s.Taint.Effect)
		}
		if s.EnforcementMode != "bootstrap-only" && s.EnforcementMode != "continuous" {
			t.Errorf("%s: enforcementMode %q: the webhook wants bootstrap-only or continuous", name, s.EnforcementMode)
		}
		modes[s.EnforcementMode] = true

		// The expect list of the comment, as plugd names its conditions.
		var value []string
		in := false
		for line := range strings.Lines(string(b)) {
			switch {
			case strings.Contains(line, "for the chart value"):
				in = true
			case in && strings.HasPrefix(line, "#   "):
				value = append(value, strings.TrimPrefix(line, "#   "))
			case in:
				in = false
			}
		}
		if len(value) == 0 {
			t.Errorf("%s: its comment gives no chart value (expect) whose conditions it waits for", name)
			continue
		}
		cfg := filepath.Join(t.TempDir(), "config.yaml")
		if err := os.WriteFile(cfg, []byte(strings.Join(value, "")), 0o600); err != nil {
			t.Fatal(err)
		}
		out, err := checkConfig(t, []string{"--config=" + cfg}, nil)
		if err != nil {
			t.Fatalf("%s: the expect of its comment: %v", name, err)
		}
		var c struct{ Expect []struct{ Condition string } }
		if err := yaml.Unmarshal([]byte(out), &c); err != nil {
			t.Fatal(err)
		}
		var plugds []string
		for _, e := range c.Expect {
			plugds = append(plugds, e.Condition)
		}
		slices.Sort(plugds)
		slices.Sort(types)
		if !slices.Equal(plugds, types) {
			t.Errorf("%s waits for conditions %q; plugd writes %q for the expect list of its comment", name, types, plugds)
		}
	}
	if !modes["bootstrap-only"] || !modes["continuous"] {
		t.Errorf("the examples show the modes %v; show both", modes)
	}
}
