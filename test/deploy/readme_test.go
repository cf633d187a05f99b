package deploy

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	yamlv3 "go.yaml.in/yaml/v3"
	"helm.sh/helm/v4/pkg/action"
	"sigs.k8s.io/yaml"
)

// The chart's README.md is generated from Chart.yaml and from values.yaml,
// its comments included, so that helm show readme says what the values
// say; it fails when one changes and the README does not ((cd test/deploy
// && go test . -run TestChartReadme -update) writes it again).
func TestChartReadme(t *testing.T) {
	golden(t, "charts/plugd/README.md", chartReadme(t))
	if *update {
		return
	}
	out, err := action.NewShow(action.ShowReadme, action.NewConfiguration()).Run(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "| `kubernetes.heartbeatInterval` |") {
		t.Errorf("helm show readme does not print the chart's README:\n%s", out)
	}
}

// readmeHead is the README's text before the values, with the chart's
// description in the %s. No version: a release stamps the chart's
// versions when it packages it, and the README would lag.
const readmeHead = `# The plugd chart

%s.

plugd runs on every node as a DaemonSet, observing the
kubelet's registry directory read-only, and keeps one Node condition per
plugin each node must have (the values ` + "`expect`" + `); plugd caretaker, one per
cluster, marks Unknown the conditions of a plugd that stopped. The manual
is docs/cluster.md and docs/kubernetes.md in plugd's repository
(https://github.com/plugd/plugd).

From a checkout of plugd:

    helm show values charts/plugd     # the values below, with their comments
    helm template plugd charts/plugd --namespace plugd --set expect[0].type=CSIPlugin --set expect[0].name=csi.example.com
    plugd --check-config --config FILE   # (go build ./cmd/plugd) checks a configuration, such as the ConfigMap's config.yaml

The chart's default image is named for its appVersion; where that image is
not in a registry your nodes pull from, set ` + "`image.repository`" + ` and
` + "`image.tag`" + ` (docs/cluster.md says how to build one).

## What is checked, and where

values.schema.json refuses, at ` + "`helm install`" + ` and ` + "`helm template`" + `, a misspelt key
and every value plugd would refuse at start where JSON Schema can say it:
ranges of durations, names with spaces, a condition the kubelet owns,
` + "`minHealthyDevices`" + ` on a plugin that is not a DevicePlugin, a taint key in a
domain Kubernetes reserves. What it cannot say is refused by plugd itself
when it starts, and before, by ` + "`plugd --check-config`" + ` on the rendered
ConfigMap: a plugin or condition listed twice in ` + "`expect`" + `, a type with two
handlers, a default condition (NAME/TYPEReady) that is not a valid name,
and whatever ` + "`extraConfig`" + ` and ` + "`extraArgs`" + ` set. The schema takes durations
written in h, m, s or ms (90s, 1.5m, 500ms) or as Go prints them (1m30s);
plugd also takes ns, us and other spellings. Quantities (` + "`resources`" + `) are
numbers or strings, as Kubernetes takes them.

## Values

Generated from values.yaml: edit the comments there.

| Key | Default | Description |
|-----|---------|-------------|
`

// chartReadme is the README: readmeHead, then a row for each key of
// values.yaml (sections and their keys, dotted), its default and its
// comment.
func chartReadme(t *testing.T) string {
	t.Helper()
	chartYAML, err := os.ReadFile(filepath.Join(chartDir, "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var meta struct{ Description string }
	if err := yaml.Unmarshal(chartYAML, &meta); err != nil {
		t.Fatal(err)
	}
	values, err := os.ReadFile(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var doc yamlv3.Node
	if err := yamlv3.Unmarshal(values, &doc); err != nil || len(doc.Content) != 1 {
		t.Fatalf("values.yaml: %v", err)
	}
	var out strings.Builder
	fmt.Fprintf(&out, readmeHead, meta.Description)
	valueRows(t, &out, "", doc.Content[0])
	return out.String()
}

// valueRows writes a row for each key of the mapping m, under prefix.
func valueRows(t *testing.T, out *strings.Builder, prefix string, m *yamlv3.Node) {
	t.Helper()
	for i := 0; i+1 < len(m.Content); i += 2 {
		k, v := m.Content[i], m.Content[i+1]
		key := prefix + k.Value
		about := commentText(k.HeadComment, k.LineComment, v.LineComment)
		if v.Kind == yamlv3.MappingNode && len(v.Content) > 0 {
			if about != "" {
				fmt.Fprintf(out, "| `%s` |  | %s |\n", key, about)
			}
			valueRows(t, out, key+".", v)
			continue
		}
		var val any
		if err := v.Decode(&val); err != nil {
			t.Fatalf("values.yaml %s: %v", key, err)
		}
		def, err := json.Marshal(val)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(out, "| `%s` | `%s` | %s |\n", key, strings.ReplaceAll(string(def), "|", `\|`), about)
	}
}

// commentText is YAML comments as one table cell: their lines joined,
// an example (a line indented past the "#") on a line of its own, as code.
func commentText(comments ...string) string {
	var parts []string
	for _, c := range comments {
		for line := range strings.SplitSeq(c, "\n") {
			line = strings.TrimPrefix(strings.TrimSpace(line), "#")
			switch {
			case strings.TrimSpace(line) == "":
			case strings.HasPrefix(line, "   "):
				parts = append(parts, "<br>`"+strings.TrimSpace(line)+"`")
			default:
				// <rootDir> is no HTML tag.
				parts = append(parts, strings.ReplaceAll(strings.TrimSpace(line), "<", `\<`))
			}
		}
	}
	return strings.ReplaceAll(strings.Join(parts, " "), "|", `\|`)
}
