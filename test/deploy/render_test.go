package deploy

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/common"
	chart "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	kubefake "helm.sh/helm/v4/pkg/kube/fake"
	release "helm.sh/helm/v4/pkg/release/v1"
	"helm.sh/helm/v4/pkg/storage"
	"helm.sh/helm/v4/pkg/storage/driver"
	"sigs.k8s.io/yaml"
)

// update rewrites the files generated from the chart and the mixin
// (deploy/kubernetes/*.yaml, testdata/rendered/*.yaml, the chart's copy of
// the rules) instead of failing when they differ.
var update = flag.Bool("update", false, "rewrite the generated files from the chart")

// repo is the repository's root.
var repo = func() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(filepath.Dir(filepath.Dir(file)))
}()

// chartDir is the chart's source.
var chartDir = filepath.Join(repo, "charts", "plugd")

// The release the generated files are rendered as.
const (
	releaseName = "plugd"
	namespace   = "plugd"
)

// loadChart loads the chart from its directory, as helm install ./charts/plugd.
func loadChart(t testing.TB) *chart.Chart {
	t.Helper()
	c, err := loader.Load(chartDir)
	if err != nil {
		t.Fatalf("loading the chart: %v", err)
	}
	return c
}

// kubeVersion is the Kubernetes version the chart is rendered for: the
// one test/kube runs. (helm template assumes a version of its own; helm
// install, the cluster's.)
const kubeVersion = "v1.37.2"

// render renders the chart with values (YAML) as helm template does:
// client-side, values checked against values.schema.json, the objects in
// helm's install order, each after a "# Source:" comment. It returns the
// manifest and NOTES.txt rendered.
func render(t testing.TB, values string) (manifest, notes string, err error) {
	t.Helper()
	return renderWith(t, values, kubeVersion)
}

// renderFor is render for the Kubernetes version kube.
func renderFor(t testing.TB, values, kube string) (manifest, notes string, err error) {
	t.Helper()
	return renderWith(t, values, kube)
}

// renderWith is render for the Kubernetes version kube whose API server
// serves apis too (helm install --api-versions: "v1/ConfigMap", as helm
// lists a cluster's kinds).
func renderWith(t testing.TB, values, kube string, apis ...string) (manifest, notes string, err error) {
	t.Helper()
	return renderChart(t, values, dryRun{kube: kube, apis: apis})
}

// renderUnchecked is render without values.schema.json: what plugd would
// be given if the schema let values through.
func renderUnchecked(t testing.TB, values string) (manifest string, err error) {
	t.Helper()
	manifest, _, err = renderChart(t, values, dryRun{kube: kubeVersion, skipSchema: true})
	return manifest, err
}

// dryRun is how a chart is installed without a server: for the
// Kubernetes version kube whose API server serves apis too, the values
// checked against values.schema.json unless skipSchema.
type dryRun struct {
	kube       string
	apis       []string
	skipSchema bool
}

func renderChart(t testing.TB, values string, o dryRun) (manifest, notes string, err error) {
	t.Helper()
	vals := map[string]any{}
	if err := yaml.Unmarshal([]byte(values), &vals); err != nil {
		t.Fatalf("values %q: %v", values, err)
	}
	rel, err := installDryRun(t, loadChart(t), vals, o)
	if err != nil {
		return "", "", err
	}
	return strings.TrimSpace(rel.Manifest) + "\n", rel.Info.Notes, nil
}

// installDryRun installs c with vals as helm install --dry-run=client
// does: rendered, no server.
func installDryRun(t testing.TB, c *chart.Chart, vals map[string]any, o dryRun) (*release.Release, error) {
	t.Helper()
	cfg := action.NewConfiguration()
	cfg.Releases = storage.Init(driver.NewMemory())
	cfg.KubeClient = &kubefake.PrintingKubeClient{Out: io.Discard, LogOutput: io.Discard}
	in := action.NewInstall(cfg)
	in.DryRunStrategy = action.DryRunClient
	in.ReleaseName = releaseName
	in.Namespace = namespace
	in.Replace = true
	in.SkipSchemaValidation = o.skipSchema
	in.APIVersions = o.apis
	if o.kube != "" {
		kv, err := common.ParseKubeVersion(o.kube)
		if err != nil {
			t.Fatal(err)
		}
		in.KubeVersion = kv
	}
	r, err := in.RunWithContext(context.Background(), c, vals)
	if err != nil {
		return nil, err
	}
	rel, ok := r.(*release.Release)
	if !ok {
		t.Fatalf("helm returned a %T, not a v1 release", r)
	}
	return rel, nil
}

// mustRender is render that fails the test on an error.
func mustRender(t testing.TB, values string) (manifest, notes string) {
	t.Helper()
	m, n, err := render(t, values)
	if err != nil {
		t.Fatalf("rendering the chart with values %q: %v", values, err)
	}
	return m, n
}

// showOnly keeps the documents of manifest rendered from the templates
// named, as helm template --show-only.
func showOnly(manifest string, templates ...string) string {
	var out strings.Builder
	for _, doc := range strings.Split(manifest, "---\n") {
		for _, tpl := range templates {
			if strings.HasPrefix(doc, "# Source: plugd/templates/"+tpl+"\n") {
				out.WriteString("---\n" + doc)
			}
		}
	}
	return out.String()
}

// golden compares got with the file at path (relative to the repository),
// or writes it with -update.
func golden(t *testing.T, path, got string) {
	t.Helper()
	full := filepath.Join(repo, path)
	if *update {
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(full)
	if err != nil {
		t.Fatalf("%v; go test ./test/deploy -update writes it", err)
	}
	if string(want) != got {
		t.Errorf("%s is not what the chart renders: edit charts/plugd, not the file, then run (cd test/deploy && go test . -update)\n%s",
			path, diff(string(want), got))
	}
}

// diff shows the first lines where a and b part.
func diff(a, b string) string {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := range max(len(al), len(bl)) {
		var x, y string
		if i < len(al) {
			x = al[i]
		}
		if i < len(bl) {
			y = bl[i]
		}
		if x != y {
			return fmt.Sprintf("line %d:\n  file:  %q\n  chart: %q", i+1, x, y)
		}
	}
	return "(same lines)"
}

// plugdBin builds plugd once, for checking configurations and flags with
// plugd --check-config: this module cannot import the daemon's loader
// (it is internal to cmd/plugd), and the binary is what runs in the pod.
var plugdBin = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "plugd-deploy-test")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "plugd")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/plugd")
	cmd.Dir = repo
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/plugd: %v\n%s", err, out)
	}
	return bin, nil
})

// checkConfig runs plugd --check-config with args and env, and returns the
// configuration it would run with, as YAML.
func checkConfig(t *testing.T, args []string, env map[string]string) (string, error) {
	t.Helper()
	bin, err := plugdBin()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, append(args, "--check-config")...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("plugd %s --check-config: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}
