package deploy

import (
	"bytes"
	"cmp"
	"context"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/rhysd/actionlint"
	yamlv3 "go.yaml.in/yaml/v3"
	"helm.sh/helm/v4/pkg/action"
	chart "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	helmregistry "helm.sh/helm/v4/pkg/registry"
	release "helm.sh/helm/v4/pkg/release/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/cli-runtime/pkg/genericclioptions"
)

// What the release workflow (.github/workflows/release.yml) does to
// ghcr.io, done to a registry on loopback (go-containerregistry's, in this
// process): release/image.sh pushes the image with IMAGE_PUSH, the chart
// is packaged and pushed as helm package and helm push do (Helm's library:
// its registry client is what helm push runs), pulled back as helm
// install oci://... does, and installed from it with a client-side dry
// run (test/deploy has no API server); every image the rendered pods run
// resolves in that registry to the image pushed, by tag and by digest.
//
// With PLUGD_KUBECONFIG set (test/kube's TestReleaseFromRegistry sets it
// to its real kube-apiserver and runs this test), the chart pulled is also
// installed as helm install --dry-run=server does, against that server,
// into the namespace PLUGD_RELEASE_NAMESPACE; the release's manifest is
// written to PLUGD_RELEASE_MANIFEST, for test/kube to apply, dry run.
func TestReleasePublish(t *testing.T) {
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer reg.Close()
	host := strings.TrimPrefix(reg.URL, "http://")
	repository := host + "/plugd/plugd"

	dir, ref := buildImage(t, "IMAGE_PUSH="+repository+":"+imageVersion)
	digest := ref[strings.Index(ref, "@")+1:]
	cranePushLayout(t, filepath.Join(dir, "image", "oci"), host+"/crane/plugd:"+imageVersion, digest)

	// helm package charts/plugd --version ${VERSION#v} --app-version
	// $VERSION; helm push to oci://HOST/charts.
	p := action.NewPackage()
	p.Version, p.AppVersion, p.Destination = strings.TrimPrefix(imageVersion, "v"), imageVersion, t.TempDir()
	pkg, err := p.Run(chartDir, nil)
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(pkg)
	if err != nil {
		t.Fatal(err)
	}
	client, err := helmregistry.NewClient(helmregistry.ClientOptPlainHTTP(), helmregistry.ClientOptWriter(io.Discard),
		helmregistry.ClientOptCredentialsFile(filepath.Join(t.TempDir(), "config.json")))
	if err != nil {
		t.Fatal(err)
	}
	chartRef := host + "/charts/plugd:" + p.Version
	if _, err := client.Push(data, chartRef); err != nil {
		t.Fatalf("pushing the chart to %s: %v", chartRef, err)
	}
	pulled, err := client.Pull(chartRef)
	if err != nil {
		t.Fatalf("pulling the chart from %s: %v", chartRef, err)
	}
	c, err := loader.LoadArchive(bytes.NewReader(pulled.Chart.Data))
	if err != nil {
		t.Fatal(err)
	}
	if c.Metadata.Version != p.Version || c.Metadata.AppVersion != imageVersion {
		t.Errorf("the chart pulled is %s, appVersion %s", c.Metadata.Version, c.Metadata.AppVersion)
	}

	// helm install plugd oci://HOST/charts/plugd --set
	// image.repository=HOST/plugd/plugd: the tag is the appVersion; then
	// pinned by the digest image.sh printed.
	for _, image := range []map[string]any{
		{"repository": repository},
		{"repository": repository, "digest": digest},
	} {
		rel, err := installDryRun(t, c, map[string]any{"image": image}, dryRun{kube: kubeVersion})
		if err != nil {
			t.Fatalf("installing the chart pulled with image %v: %v", image, err)
		}
		for _, img := range podImages(t, rel.Manifest) {
			checkResolves(t, img, digest)
		}
	}
	if kubeconfig := os.Getenv("PLUGD_KUBECONFIG"); kubeconfig != "" {
		rel := installServerDryRun(t, c, map[string]any{"image": map[string]any{"repository": repository}},
			kubeconfig, os.Getenv("PLUGD_RELEASE_NAMESPACE"))
		for _, img := range podImages(t, rel.Manifest) {
			checkResolves(t, img, digest)
		}
		if err := os.WriteFile(os.Getenv("PLUGD_RELEASE_MANIFEST"), []byte(rel.Manifest), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// installServerDryRun installs c with vals into namespace ns as helm
// install --dry-run=server --namespace ns does, against the API server of
// kubeconfig: Helm's library renders the chart (lookup reads that
// server), builds each object with the server's discovery and validates it
// against the server's OpenAPI schema, and looks for objects of the same
// names already there that the release would take over; it writes
// nothing.
func installServerDryRun(t *testing.T, c *chart.Chart, vals map[string]any, kubeconfig, ns string) *release.Release {
	t.Helper()
	if ns == "" {
		t.Fatal("PLUGD_KUBECONFIG is set and PLUGD_RELEASE_NAMESPACE is not")
	}
	flags := genericclioptions.NewConfigFlags(false)
	flags.KubeConfig, flags.Namespace = &kubeconfig, &ns
	cfg := action.NewConfiguration()
	if err := cfg.Init(flags, ns, "secret"); err != nil {
		t.Fatal(err)
	}
	in := action.NewInstall(cfg)
	in.DryRunStrategy = action.DryRunServer
	// A release name of its own where the API server is shared with other
	// tests (PLUGD_RELEASE_NAME): their cluster-scoped objects (plugd's
	// ClusterRoles) are not Helm's, and Helm would refuse to take them
	// over.
	in.ReleaseName, in.Namespace = cmp.Or(os.Getenv("PLUGD_RELEASE_NAME"), releaseName), ns
	r, err := in.RunWithContext(context.Background(), c, vals)
	if err != nil {
		t.Fatalf("helm install --dry-run=server against %s: %v", kubeconfig, err)
	}
	rel, ok := r.(*release.Release)
	if !ok {
		t.Fatalf("helm returned a %T, not a v1 release", r)
	}
	if rel.Info.Description != "Dry run complete" {
		t.Errorf("helm install --dry-run=server: %q", rel.Info.Description)
	}
	return rel
}

// cranePushLayout pushes the OCI layout in dir to ref as crane push DIR
// REF does (its one entry, the image index), and checks that ref then
// resolves to digest.
func cranePushLayout(t *testing.T, dir, ref, digest string) {
	t.Helper()
	l, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	m, err := l.IndexManifest()
	if err != nil || len(m.Manifests) != 1 {
		t.Fatalf("the layout's index.json: %v, %v; crane push wants one entry", m, err)
	}
	idx, err := l.ImageIndex(m.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteIndex(r, idx); err != nil {
		t.Fatalf("pushing the layout to %s: %v", ref, err)
	}
	checkResolves(t, ref, digest)
}

// podImages are the images of every container of the DaemonSets and
// Deployments in manifest.
func podImages(t *testing.T, manifest string) []string {
	t.Helper()
	o := decode(t, strings.TrimSpace(manifest)+"\n")
	var specs []corev1.PodSpec
	for _, d := range o.daemonSets {
		specs = append(specs, d.Spec.Template.Spec)
	}
	for _, d := range o.deployments {
		specs = append(specs, d.Spec.Template.Spec)
	}
	var images []string
	for _, s := range specs {
		for _, c := range append(s.InitContainers, s.Containers...) {
			images = append(images, c.Image)
		}
	}
	if len(images) == 0 {
		t.Fatalf("the chart renders no pod")
	}
	return images
}

// checkResolves fetches img's manifest from the registry it names: an
// index whose digest is digest.
func checkResolves(t *testing.T, img, digest string) {
	t.Helper()
	r, err := name.ParseReference(img)
	if err != nil {
		t.Fatalf("the pods' image %q: %v", img, err)
	}
	desc, err := remote.Get(r)
	if err != nil {
		t.Errorf("the pods' image %s does not resolve: %v", img, err)
		return
	}
	if !desc.MediaType.IsIndex() || desc.Digest.String() != digest {
		t.Errorf("the pods' image %s is a %s %s, not the index pushed, %s", img, desc.MediaType, desc.Digest, digest)
	}
}

// The release workflow lints clean with actionlint (its checks of
// expressions, action inputs, runner labels and permissions), runs on a
// tag v*, and runs the scripts the tests run: release/package.sh for the
// archives and the image's binaries, release/image.sh for the image.
func TestReleaseWorkflow(t *testing.T) {
	path := filepath.Join(repo, ".github", "workflows", "release.yml")
	var log bytes.Buffer
	l, err := actionlint.NewLinter(&log, &actionlint.LinterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	errs, err := l.LintFile(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range errs {
		t.Errorf("actionlint: %s:%d:%d: %s [%s]", filepath.Base(e.Filepath), e.Line, e.Column, e.Message, e.Kind)
	}

	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var wf struct {
		On struct {
			Push struct {
				Tags []string `yaml:"tags"`
			} `yaml:"push"`
		} `yaml:"on"`
		Jobs map[string]struct {
			Steps []struct {
				Uses string            `yaml:"uses"`
				Run  string            `yaml:"run"`
				Env  map[string]string `yaml:"env"`
			} `yaml:"steps"`
		} `yaml:"jobs"`
	}
	if err := yamlv3.Unmarshal(b, &wf); err != nil {
		t.Fatal(err)
	}
	if len(wf.On.Push.Tags) != 1 || wf.On.Push.Tags[0] != "v*" {
		t.Errorf("the workflow runs on tags %q, want v*", wf.On.Push.Tags)
	}
	var runs, uses []string
	imagePush := ""
	for _, j := range wf.Jobs {
		for _, s := range j.Steps {
			runs = append(runs, s.Run)
			uses = append(uses, strings.Split(s.Uses, "@")[0])
			if v, ok := s.Env["IMAGE_PUSH"]; ok {
				imagePush = v
			}
		}
	}
	// The image is pushed where the chart's default image.repository
	// looks for it, tagged as the chart's appVersion (the tag).
	c := loadChart(t)
	repository, _ := c.Values["image"].(map[string]any)["repository"].(string)
	if imagePush != repository+":${{ github.ref_name }}" {
		t.Errorf("the workflow pushes the image to %q; the chart runs %s:TAG", imagePush, repository)
	}
	all := strings.Join(runs, "\n")
	for _, want := range []string{
		`release/package.sh "$VERSION" dist`,
		`release/image.sh "$VERSION" dist`,
		`helm package charts/plugd --version "${VERSION#v}" --app-version "$VERSION"`,
		`helm push "dist/chart/plugd-${VERSION#v}.tgz" oci://ghcr.io/plugd/charts`,
		`dist/*.tar.gz dist/checksums.txt dist/plugd.yaml dist/sbom/*.txt`,
	} {
		if !strings.Contains(all, want) {
			t.Errorf("the workflow does not run %s", want)
		}
	}
	for _, want := range []string{"docker/login-action", "azure/setup-helm", "rajatjindal/krew-release-bot"} {
		if !strings.Contains(strings.Join(uses, " "), want) {
			t.Errorf("the workflow does not use %s", want)
		}
	}
}
