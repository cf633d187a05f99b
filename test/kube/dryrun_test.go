//go:build linux

package kube

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"
)

// The Helm chart's renderings, the ones kubectl users apply
// (deploy/kubernetes) and the ones with every option on and off
// (test/deploy/testdata/rendered, which test/deploy keeps equal to the
// chart), are accepted by a real API server: a server-side apply of each
// object, dry run, as kubectl apply --server-side --dry-run=server sends
// it. The API server validates each field against its OpenAPI schema,
// strictly (an unknown or duplicate field is an error), and runs its
// admission. The Prometheus Operator's kinds are skipped: their CRDs are
// not installed here (test/deploy decodes them strictly into the
// operator's Go types).
func TestChartDryRun(t *testing.T) {
	ctx := context.Background()
	sd := newServerDryRun(t)
	// The namespace, for real: a namespaced object cannot be applied, even
	// in a dry run, where there is none.
	applyManifest(t, "deploy/kubernetes/namespace.yaml")
	files, err := filepath.Glob(filepath.Join(dirs.Repo, "deploy", "kubernetes", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	rendered, _ := filepath.Glob(filepath.Join(dirs.Repo, "test", "deploy", "testdata", "rendered", "*.yaml"))
	files = append(files, rendered...)
	if len(files) < 5 {
		t.Fatalf("only %d renderings: %v", len(files), files)
	}
	applied := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(dirs.Repo, f)
		applied += sd.apply(ctx, t, rel, b)
	}
	t.Logf("%d objects of %d renderings accepted (server-side apply, dry run)", applied, len(files))

	// And the check can fail: a field the API does not have is refused.
	bad := []byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"plugd","namespace":"plugd"},"data":{},"dta":{}}`)
	force := true
	_, err = sd.dyn.Resource(mapping(t, sd.mapper, "", "v1", "ConfigMap")).Namespace("plugd").Patch(ctx, "plugd", types.ApplyPatchType, bad,
		metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}, FieldManager: "plugd-chart-test", Force: &force, FieldValidation: metav1.FieldValidationStrict})
	if err == nil || !strings.Contains(err.Error(), "dta") {
		t.Errorf("a ConfigMap with a misspelt field: %v", err)
	}
}

// serverDryRun applies manifests to the API server as kubectl apply
// --server-side --dry-run=server does.
type serverDryRun struct {
	mapper meta.RESTMapper
	dyn    dynamic.Interface
}

func newServerDryRun(t *testing.T) serverDryRun {
	t.Helper()
	rc := cp.Config(cp.AdminToken)
	dc, err := discovery.NewDiscoveryClientForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	groups, err := restmapper.GetAPIGroupResources(dc)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	return serverDryRun{mapper: restmapper.NewDiscoveryRESTMapper(groups), dyn: dyn}
}

// apply applies each object of the YAML documents b (named rel in
// errors), dry run, strict about fields, and returns how many it applied.
// The Prometheus Operator's kinds are skipped: their CRDs are not
// installed here.
func (sd serverDryRun) apply(ctx context.Context, t *testing.T, rel string, b []byte) int {
	t.Helper()
	applied := 0
	for i, doc := range bytes.Split(b, []byte("\n---\n")) {
		j, err := yaml.YAMLToJSONStrict(doc)
		if err != nil {
			t.Fatalf("%s document %d: %v", rel, i+1, err)
		}
		if string(j) == "null" {
			continue
		}
		var u unstructured.Unstructured
		if err := u.UnmarshalJSON(j); err != nil {
			t.Fatalf("%s document %d: %v", rel, i+1, err)
		}
		gvk := u.GroupVersionKind()
		if gvk.Group == "monitoring.coreos.com" {
			t.Logf("%s: %s %s skipped: no Prometheus Operator CRDs here", rel, gvk.Kind, u.GetName())
			continue
		}
		m, err := sd.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			t.Fatalf("%s document %d: %s: %v", rel, i+1, gvk, err)
		}
		var ri dynamic.ResourceInterface = sd.dyn.Resource(m.Resource)
		if m.Scope.Name() == meta.RESTScopeNameNamespace {
			ri = sd.dyn.Resource(m.Resource).Namespace(u.GetNamespace())
		}
		force := true
		_, err = ri.Patch(ctx, u.GetName(), types.ApplyPatchType, j, metav1.PatchOptions{
			DryRun: []string{metav1.DryRunAll}, FieldManager: "plugd-chart-test", Force: &force,
			FieldValidation: metav1.FieldValidationStrict,
		})
		if err != nil {
			msg := err.Error()
			if apierrors.IsInvalid(err) || apierrors.IsBadRequest(err) || strings.Contains(msg, "unknown field") {
				t.Errorf("%s: the API server refuses %s %s: %v", rel, gvk.Kind, u.GetName(), err)
				continue
			}
			t.Fatalf("%s: applying %s %s (dry run): %v", rel, gvk.Kind, u.GetName(), err)
		}
		applied++
	}
	return applied
}

func mapping(t *testing.T, m meta.RESTMapper, group, version, kind string) schema.GroupVersionResource {
	t.Helper()
	rm, err := m.RESTMapping(schema.GroupKind{Group: group, Kind: kind}, version)
	if err != nil {
		t.Fatal(err)
	}
	return rm.Resource
}
