package deploy

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"debug/buildinfo"
	"debug/elf"
	"encoding/hex"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// krewPlugin is krew's plugin manifest (krew.googlecontainertools.github.com/v1alpha2).
type krewPlugin struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Version          string `json:"version"`
		Homepage         string `json:"homepage"`
		ShortDescription string `json:"shortDescription"`
		Description      string `json:"description"`
		Caveats          string `json:"caveats"`
		Platforms        []struct {
			Selector metav1.LabelSelector `json:"selector"`
			URI      string               `json:"uri"`
			Sha256   string               `json:"sha256"`
			Bin      string               `json:"bin"`
			Files    []struct {
				From string `json:"from"`
				To   string `json:"to"`
			} `json:"files"`
		} `json:"platforms"`
	} `json:"spec"`
}

// The image's build (the Dockerfile's RUN, with buildx's TARGETOS and
// TARGETARCH) cross-compiles static, stamped binaries, and the release
// recipe (release/package.sh) makes the kubectl plugin's archives, their
// checksums, the krew manifest that names them, and an SBOM of each
// binary. Run here for two of the plugin's platforms and the image's arm64,
// without Docker.
func TestRelease(t *testing.T) {
	dockerfile, err := os.ReadFile(filepath.Join(repo, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"FROM --platform=$BUILDPLATFORM", "ARG TARGETOS", "ARG TARGETARCH",
		`release/build.sh /out "$TARGETOS" "$TARGETARCH" "$VERSION" plugd plugctl`, "COPY --from=build /out/plugd /out/plugctl /usr/local/bin/"} {
		if !strings.Contains(string(dockerfile), want) {
			t.Errorf("the Dockerfile lacks %q", want)
		}
	}

	// The builder's Go is the one go.mod names, to the patch release: a
	// floating tag (golang:1.26) builds with whatever it points at that
	// day, and the SBOM would not say what the image holds.
	gomod, err := os.ReadFile(filepath.Join(repo, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	goLine := regexp.MustCompile(`(?m)^go (\S+)$`).FindSubmatch(gomod)
	from := regexp.MustCompile(`(?m)^FROM --platform=\$BUILDPLATFORM golang:(\S+) AS build$`).FindSubmatch(dockerfile)
	if goLine == nil || from == nil || string(from[1]) != string(goLine[1]) {
		t.Errorf("the Dockerfile's builder is golang:%s, go.mod's go line %s: pin the builder to go.mod's Go, patch release included", field(from), field(goLine))
	}

	const version = "v0.0.0-test.1"
	out := t.TempDir()
	cmd := exec.Command(filepath.Join(repo, "release", "package.sh"), version, out)
	// One cross-compiled platform for both: each more costs CI a build of
	// every dependency.
	cmd.Env = append(os.Environ(), "PLATFORMS=linux/arm64", "IMAGE_ARCHES=arm64")
	progress, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("release/package.sh: %v\n%s", err, progress)
	}
	// Minutes on a cold cache: it says what it builds before each step,
	// and how long each took.
	if !regexp.MustCompile(`(?s)package\.sh: release v0\.0\.0-test\.1, 3 steps; .*minutes.*` +
		`\[1/3\] kubectl-plugd for linux/arm64.*done in \d+s.*` +
		`\[2/3\] plugd, plugctl, kubectl-plugd for the image's linux/arm64.*done in \d+s.*` +
		`\[3/3\] the krew manifest.*done in \d+s.*package\.sh: done in \d+s`).Match(progress) {
		t.Errorf("release/package.sh does not say each step before it starts, with its time:\n%s", progress)
	}

	// The image's binaries: for linux/arm64, static, stamped, without cgo.
	for _, b := range []string{"plugd", "plugctl", "kubectl-plugd"} {
		path := filepath.Join(out, "bin", "linux_arm64", b)
		f, err := elf.Open(path)
		if err != nil {
			t.Fatalf("%s: %v", b, err)
		}
		if f.Machine != elf.EM_AARCH64 {
			t.Errorf("%s is for %s, not arm64", b, f.Machine)
		}
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				t.Errorf("%s asks for a dynamic loader: it is not static", b)
			}
		}
		f.Close()
		checkBuild(t, path, "linux", "arm64", version)
		sbom, err := os.ReadFile(filepath.Join(out, "sbom", b+"_linux_arm64.txt"))
		if err != nil || !strings.Contains(string(sbom), "\tmod\tgithub.com/plugd/plugd") || !strings.Contains(string(sbom), "\tdep\t") {
			t.Errorf("sbom of %s: %v\n%s", b, err, sbom)
		}
	}
	if _, err := os.Stat(filepath.Join(out, "bin", "linux_amd64")); !os.IsNotExist(err) {
		t.Errorf("IMAGE_ARCHES=arm64 built amd64 too: %v", err)
	}

	// The plugin's archives and their checksums.
	sums := map[string]string{}
	f, err := os.Open(filepath.Join(out, "checksums.txt"))
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		sum, name, ok := strings.Cut(sc.Text(), "  ")
		if !ok {
			t.Fatalf("checksums.txt: %q is not sha256sum's", sc.Text())
		}
		sums[name] = sum
	}
	f.Close()
	archives := map[string]string{ // archive: the executable in it
		"kubectl-plugd_" + version + "_linux_arm64.tar.gz": "kubectl-plugd",
	}
	if len(sums) != len(archives) {
		t.Errorf("checksums.txt lists %v", sums)
	}
	for a, exe := range archives {
		b, err := os.ReadFile(filepath.Join(out, a))
		if err != nil {
			t.Fatal(err)
		}
		h := sha256.Sum256(b)
		if sums[a] != hex.EncodeToString(h[:]) {
			t.Errorf("%s: sha256 %x, checksums.txt says %s", a, h, sums[a])
		}
		files := untar(t, filepath.Join(out, a), t.TempDir())
		if !slices.Equal(files, []string{exe}) {
			t.Errorf("%s holds %q, want %s", a, files, exe)
		}
	}
	// The archives are reproducible: packaging again gives the same bytes.
	again := t.TempDir()
	cmd = exec.Command(filepath.Join(repo, "release", "package.sh"), version, again)
	cmd.Env = append(os.Environ(), "PLATFORMS=linux/arm64", "IMAGE_ARCHES=arm64")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("release/package.sh again: %v\n%s", err, b)
	}
	if b, _ := os.ReadFile(filepath.Join(again, "checksums.txt")); !strings.Contains(string(b), sums["kubectl-plugd_"+version+"_linux_arm64.tar.gz"]) {
		t.Errorf("packaging again gave another archive:\n%s\nfirst: %v", b, sums)
	}

	// The krew manifest: the template rendered, naming each archive built
	// with its checksum, and only those.
	b, err := os.ReadFile(filepath.Join(out, "plugd.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var k krewPlugin
	if err := yaml.UnmarshalStrict(b, &k); err != nil {
		t.Fatalf("plugd.yaml: %v\n%s", err, b)
	}
	if k.APIVersion != "krew.googlecontainertools.github.com/v1alpha2" || k.Kind != "Plugin" || k.Name != "plugd" || k.Spec.Version != version ||
		k.Spec.ShortDescription == "" || k.Spec.Homepage == "" || len(k.Spec.Platforms) != len(archives) {
		t.Errorf("plugd.yaml: %+v\n%s", k, b)
	}
	for _, p := range k.Spec.Platforms {
		os, arch := p.Selector.MatchLabels["os"], p.Selector.MatchLabels["arch"]
		a := "kubectl-plugd_" + version + "_" + os + "_" + arch + ".tar.gz"
		if p.URI != "https://github.com/plugd/plugd/releases/download/"+version+"/"+a || p.Sha256 != sums[a] || p.Bin != archives[a] {
			t.Errorf("plugd.yaml platform %s/%s: %+v; want %s with sha256 %s", os, arch, p, a, sums[a])
		}
	}
	if regexp.MustCompile(`\{\{|addURIAndSha|TagName`).Match(b) {
		t.Errorf("plugd.yaml keeps template syntax:\n%s", b)
	}
}

// checkBuild reads the build information Go keeps in a binary (what go
// version -m prints): built for goos/goarch, without cgo, -trimpath; and
// finds the version stamped in it (-trimpath keeps -ldflags out of the
// build information, as they may hold paths).
func checkBuild(t *testing.T, path, goos, goarch, version string) {
	t.Helper()
	bi, err := buildinfo.ReadFile(path)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	settings := map[string]string{}
	for _, s := range bi.Settings {
		settings[s.Key] = s.Value
	}
	if settings["GOOS"] != goos || settings["GOARCH"] != goarch || settings["CGO_ENABLED"] != "0" || settings["-trimpath"] != "true" {
		t.Errorf("%s was built with %v", filepath.Base(path), settings)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(b, []byte(version)) {
		t.Errorf("%s does not hold its version %s", filepath.Base(path), version)
	}
}

// untar extracts a .tar.gz into dir and returns the names in it.
func untar(t *testing.T, archive, dir string) []string {
	t.Helper()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(gz)
	var names []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return names
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
		if h.Mode&0o111 == 0 {
			t.Errorf("%s: %s is not executable (mode %o)", archive, h.Name, h.Mode)
		}
		w, err := os.Create(filepath.Join(dir, filepath.Base(h.Name)))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(w, tr); err != nil {
			t.Fatal(err)
		}
		w.Close()
	}
}

// The chart packages as helm package does, at the release's version, and
// the package holds what the chart needs (the schema, the rules) and
// renders.
func TestChartPackage(t *testing.T) {
	p := action.NewPackage()
	p.Version, p.AppVersion, p.Destination = "1.2.3", "v1.2.3", t.TempDir()
	path, err := p.Run(chartDir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Base(path) != "plugd-1.2.3.tgz" {
		t.Errorf("packaged as %s", path)
	}
	c, err := loader.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if c.Metadata.Version != "1.2.3" || c.Metadata.AppVersion != "v1.2.3" || c.Schema == nil ||
		!slices.ContainsFunc(c.Files, func(f *common.File) bool { return f.Name == "files/rules.yaml" }) ||
		!slices.ContainsFunc(c.Files, func(f *common.File) bool { return f.Name == "README.md" }) {
		t.Errorf("the package: version %s, appVersion %s, schema %d bytes, files %v", c.Metadata.Version, c.Metadata.AppVersion, len(c.Schema), c.Files)
	}
}

// field is a regexp's first submatch, or "(none)".
func field(m [][]byte) string {
	if m == nil {
		return "(none)"
	}
	return string(m[1])
}
