package deploy

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
)

// The version the image tests stamp and tag, and the time and commit
// they give release/image.sh (SOURCE_DATE_EPOCH, REVISION), as the
// release workflow gives it the tag's.
const (
	imageVersion  = "v0.0.0-test.2"
	imageEpoch    = "1767225600" // 2026-01-01T00:00:00Z
	imageRevision = "0123456789abcdef0123456789abcdef01234567"
)

// releaseDist is release/package.sh's output for the image's two
// platforms (and the plugin's linux/arm64 only, as TestRelease), built
// once for the image tests: the binaries release/image.sh puts in the
// image.
var releaseDist = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "plugd-deploy-test")
	if err != nil {
		return "", err
	}
	cmd := exec.Command(filepath.Join(repo, "release", "package.sh"), imageVersion, dir)
	cmd.Env = append(os.Environ(), "PLATFORMS=linux/arm64", "IMAGE_ARCHES=amd64 arm64")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("release/package.sh: %v\n%s", err, out)
	}
	return dir, nil
})

// buildImage runs release/image.sh as the release workflow does, on
// releaseDist's binaries, into a directory of its own, with env added
// (IMAGE_PUSH). It returns that directory and the reference by digest
// image.sh printed.
func buildImage(t *testing.T, env ...string) (dir, ref string) {
	t.Helper()
	dist, err := releaseDist()
	if err != nil {
		t.Fatal(err)
	}
	dir = t.TempDir()
	if err := os.Symlink(filepath.Join(dist, "bin"), filepath.Join(dir, "bin")); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(repo, "release", "image.sh"), imageVersion, dir)
	cmd.Env = append(os.Environ(), append([]string{"SOURCE_DATE_EPOCH=" + imageEpoch, "REVISION=" + imageRevision}, env...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("release/image.sh: %v\n%s%s", err, stdout.String(), stderr.String())
	}
	if !regexp.MustCompile(`(?s)^image\.sh: plugd v0\.0\.0-test\.2 .*\.\.\.\n.*image\.sh: done in \d+s\n$`).MatchString(stderr.String()) {
		t.Errorf("release/image.sh does not say what it builds before it starts, and how long it took:\n%s", stderr.String())
	}
	ref = strings.TrimSpace(stdout.String())
	if !regexp.MustCompile(`^ghcr\.io/plugd/plugd@sha256:[0-9a-f]{64}$`).MatchString(ref) {
		t.Fatalf("release/image.sh printed %q, not the image's reference by digest", ref)
	}
	return dir, ref
}

// release/image.sh builds plugd's image without Docker: an index of
// linux/amd64 and linux/arm64 images, each plugd and plugctl in
// /usr/local/bin run as the Dockerfile's image runs them, labelled with
// the release's source, version and revision, every time in it
// SOURCE_DATE_EPOCH; in an OCI layout, and an archive of it named for
// containerd. Building again gives the same digest and the same bytes, and
// the binary for this machine runs.
func TestImage(t *testing.T) {
	dir, ref := buildImage(t)
	top, err := layout.ImageIndexFromPath(filepath.Join(dir, "image", "oci"))
	if err != nil {
		t.Fatal(err)
	}
	tm, err := top.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(tm.Manifests) != 1 || !tm.Manifests[0].MediaType.IsIndex() ||
		tm.Manifests[0].Annotations["io.containerd.image.name"] != "ghcr.io/plugd/plugd:"+imageVersion ||
		tm.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != imageVersion ||
		"ghcr.io/plugd/plugd@"+tm.Manifests[0].Digest.String() != ref {
		t.Fatalf("the layout's index.json: %+v; want one image index, %s, named ghcr.io/plugd/plugd:%s", tm.Manifests, ref, imageVersion)
	}
	idx, err := top.ImageIndex(tm.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	var platforms []string
	for _, m := range im.Manifests {
		if m.Platform == nil {
			t.Fatalf("index entry %s has no platform", m.Digest)
		}
		platforms = append(platforms, m.Platform.String())
		img, err := idx.Image(m.Digest)
		if err != nil {
			t.Fatal(err)
		}
		checkImageConfig(t, img, m.Platform.Architecture)
		checkImageFiles(t, img, m.Platform.Architecture)
	}
	if !slices.Equal(platforms, []string{"linux/amd64", "linux/arm64"}) {
		t.Errorf("the index's platforms are %q, want linux/amd64 and linux/arm64", platforms)
	}

	// The archive is the layout: its files, the same bytes.
	checkArchiveIsLayout(t, filepath.Join(dir, "image", "plugd-image.tar"), filepath.Join(dir, "image", "oci"))

	// Reproducible: the same binaries, time and commit, the same image
	// and the same archive.
	again, ref2 := buildImage(t)
	if ref2 != ref {
		t.Errorf("building the image again gave %s, first %s", ref2, ref)
	}
	a, _ := os.ReadFile(filepath.Join(dir, "image", "plugd-image.tar"))
	b, _ := os.ReadFile(filepath.Join(again, "image", "plugd-image.tar"))
	if len(a) == 0 || !bytes.Equal(a, b) {
		t.Errorf("building the image again gave another archive (%d and %d bytes)", len(a), len(b))
	}
}

// checkImageConfig checks the image's config against the Dockerfile's:
// its entrypoint and user, and the OCI labels.
func checkImageConfig(t *testing.T, img v1.Image, arch string) {
	t.Helper()
	dockerfile, err := os.ReadFile(filepath.Join(repo, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	user := regexp.MustCompile(`(?m)^USER (\S+)$`).FindSubmatch(dockerfile)
	entrypoint := regexp.MustCompile(`(?m)^ENTRYPOINT \["([^"]+)"\]$`).FindSubmatch(dockerfile)
	if user == nil || entrypoint == nil {
		t.Fatalf("the Dockerfile has no USER or ENTRYPOINT [\"...\"] line")
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.OS != "linux" || cf.Architecture != arch {
		t.Errorf("linux/%s: the config says %s/%s", arch, cf.OS, cf.Architecture)
	}
	if !slices.Equal(cf.Config.Entrypoint, []string{string(entrypoint[1])}) || cf.Config.User != string(user[1]) {
		t.Errorf("linux/%s: entrypoint %q, user %q; the Dockerfile's are [%s], %s", arch, cf.Config.Entrypoint, cf.Config.User, entrypoint[1], user[1])
	}
	want := map[string]string{
		"org.opencontainers.image.source":   "https://github.com/plugd/plugd",
		"org.opencontainers.image.version":  imageVersion,
		"org.opencontainers.image.revision": imageRevision,
	}
	for k, v := range want {
		if cf.Config.Labels[k] != v {
			t.Errorf("linux/%s: label %s is %q, want %q", arch, k, cf.Config.Labels[k], v)
		}
	}
	if got := cf.Created.Unix(); fmt.Sprint(got) != imageEpoch {
		t.Errorf("linux/%s: created %s, not SOURCE_DATE_EPOCH %s", arch, cf.Created.Time, imageEpoch)
	}
	for _, h := range cf.History {
		if fmt.Sprint(h.Created.Unix()) != imageEpoch {
			t.Errorf("linux/%s: history %q created %s, not SOURCE_DATE_EPOCH", arch, h.CreatedBy, h.Created.Time)
		}
	}
}

// checkImageFiles reads the image's one layer: usr/local/bin/plugd and
// plugctl, for arch, stamped with the version, every time
// SOURCE_DATE_EPOCH. On this machine's architecture it runs plugd
// version from the layer.
func checkImageFiles(t *testing.T, img v1.Image, arch string) {
	t.Helper()
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("linux/%s: layers %v, %v; want one", arch, layers, err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	dir := t.TempDir()
	var files []string
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("linux/%s: the layer: %v", arch, err)
		}
		files = append(files, h.Name)
		if fmt.Sprint(h.ModTime.Unix()) != imageEpoch || h.Uid != 0 || h.Gid != 0 {
			t.Errorf("linux/%s: %s: time %s, owner %d:%d; want SOURCE_DATE_EPOCH, root", arch, h.Name, h.ModTime, h.Uid, h.Gid)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		if h.Mode&0o111 == 0 {
			t.Errorf("linux/%s: %s is not executable (mode %o)", arch, h.Name, h.Mode)
		}
		path := filepath.Join(dir, filepath.Base(h.Name))
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, b, 0o755); err != nil {
			t.Fatal(err)
		}
		checkBuild(t, path, "linux", arch, imageVersion)
		if f, err := elf.Open(path); err != nil || f.Machine != map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}[arch] {
			t.Errorf("linux/%s: %s: %v, %v", arch, h.Name, f, err)
		} else {
			f.Close()
		}
	}
	if !slices.Equal(files, []string{"usr/", "usr/local/", "usr/local/bin/", "usr/local/bin/plugd", "usr/local/bin/plugctl"}) {
		t.Errorf("linux/%s: the layer holds %q", arch, files)
	}
	if arch != runtime.GOARCH || runtime.GOOS != "linux" {
		return
	}
	out, err := exec.Command(filepath.Join(dir, "plugd"), "version").CombinedOutput()
	if err != nil || !strings.Contains(string(out), imageVersion) {
		t.Errorf("plugd version, from the linux/%s image: %v\n%s", arch, err, out)
	}
}

// checkArchiveIsLayout checks that the tar archive holds the layout's
// files, byte for byte, and nothing else.
func checkArchiveIsLayout(t *testing.T, archive, dir string) {
	t.Helper()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var names []string
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", archive, err)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		names = append(names, h.Name)
		got, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		want, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(h.Name)))
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s in the archive is not the layout's: %v", h.Name, err)
		}
	}
	var want []string
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			rel, _ := filepath.Rel(dir, p)
			want = append(want, filepath.ToSlash(rel))
		}
		return err
	})
	slices.Sort(want)
	if !slices.Equal(names, want) || !slices.Contains(names, "oci-layout") || !slices.Contains(names, "index.json") {
		t.Errorf("the archive holds %q, the layout %q", names, want)
	}
}

// release/image.sh refuses binaries the image cannot run, saying which
// and what to do: here the amd64 binaries where the arm64 ones belong.
func TestImageRefusesOtherPlatforms(t *testing.T) {
	dist, err := releaseDist()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(dist, "bin", "linux_amd64"), filepath.Join(dir, "bin", "linux_arm64")); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(repo, "release", "image.sh"), imageVersion, dir)
	cmd.Env = append(os.Environ(), "IMAGE_ARCHES=arm64", "SOURCE_DATE_EPOCH="+imageEpoch, "REVISION="+imageRevision)
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "cmd/plugd for linux/amd64 with CGO_ENABLED=0; the image wants github.com/plugd/plugd/cmd/plugd for linux/arm64") ||
		!strings.Contains(string(out), "release/build.sh") {
		t.Errorf("release/image.sh with amd64 binaries for arm64: %v\n%s", err, out)
	}
	if _, err := os.Stat(filepath.Join(dir, "image", "oci", "index.json")); !os.IsNotExist(err) {
		t.Errorf("release/image.sh wrote an image all the same: %v", err)
	}
}
