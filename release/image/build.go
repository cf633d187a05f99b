package main

import (
	"archive/tar"
	"bytes"
	"debug/buildinfo"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// binaries are the programs the image holds, in /usr/local/bin, as the
// Dockerfile's image does; plugd is the entrypoint.
var binaries = []string{"plugd", "plugctl"}

// buildIndex makes one image per architecture and the index over them.
func buildIndex(o options) (v1.ImageIndex, error) {
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, arch := range o.arches {
		img, err := buildImage(o, arch)
		if err != nil {
			return nil, fmt.Errorf("linux/%s: %w", arch, err)
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
			Add:        img,
			Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: arch}},
		})
	}
	return idx, nil
}

// buildImage is the image for linux/arch: the binaries in one layer, and a
// config that runs plugd as root (the Dockerfile says why) with the OCI
// labels.
func buildImage(o options, arch string) (v1.Image, error) {
	layerTar, err := binariesTar(filepath.Join(o.binDir, "linux_"+arch), arch, o)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	base := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	base = mutate.ConfigMediaType(base, types.OCIConfigJSON)
	img, err := mutate.Append(base, mutate.Addendum{
		Layer:     layer,
		MediaType: types.OCILayer,
		History: v1.History{
			Created:   v1.Time{Time: o.created},
			CreatedBy: "release/image.sh: COPY " + strings.Join(binaries, " ") + " /usr/local/bin/",
			Comment:   "plugd " + o.version,
		},
	})
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", arch
	cf.Created = v1.Time{Time: o.created}
	cf.Config.Entrypoint = []string{"/usr/local/bin/plugd"}
	cf.Config.User = "0:0"
	cf.Config.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	cf.Config.Labels = labels(o)
	return mutate.ConfigFile(img, cf)
}

// labels are the image's OCI annotations, as labels of its config.
func labels(o options) map[string]string {
	return map[string]string{
		"org.opencontainers.image.source":   o.source,
		"org.opencontainers.image.version":  o.version,
		"org.opencontainers.image.revision": o.revision,
		"org.opencontainers.image.title":    "plugd",
	}
}

// binariesTar is the layer's tar: usr/local/bin/ and the binaries from
// dir, owned by root, every time o.created, so that the same binaries
// give the same bytes.
func binariesTar(dir, arch string, o options) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, d := range []string{"usr/", "usr/local/", "usr/local/bin/"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o755, ModTime: o.created, Format: tar.FormatPAX}); err != nil {
			return nil, err
		}
	}
	for _, b := range binaries {
		data, err := os.ReadFile(filepath.Join(dir, b))
		if err != nil {
			return nil, fmt.Errorf("%w (build it with release/package.sh, or release/build.sh DIR/linux_ARCH linux ARCH VERSION plugd plugctl)", err)
		}
		if err := checkBinary(filepath.Join(dir, b), b, arch); err != nil {
			return nil, err
		}
		h := &tar.Header{Typeflag: tar.TypeReg, Name: "usr/local/bin/" + b, Mode: 0o755, Size: int64(len(data)), ModTime: o.created, Format: tar.FormatPAX}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// checkBinary refuses a binary that is not the program name built by
// release/build.sh for linux/arch: another program, another platform, or
// one that needs libc (the image has none).
func checkBinary(path, name, arch string) error {
	bi, err := buildinfo.ReadFile(path)
	if err != nil {
		return fmt.Errorf("%s: not a Go binary: %w", path, err)
	}
	settings := map[string]string{}
	for _, s := range bi.Settings {
		settings[s.Key] = s.Value
	}
	want := "github.com/plugd/plugd/cmd/" + name
	if bi.Path != want || settings["GOOS"] != "linux" || settings["GOARCH"] != arch || settings["CGO_ENABLED"] != "0" {
		return fmt.Errorf("%s is %s for %s/%s with CGO_ENABLED=%s; the image wants %s for linux/%s with CGO_ENABLED=0: build it with release/build.sh",
			path, bi.Path, settings["GOOS"], settings["GOARCH"], settings["CGO_ENABLED"], want, arch)
	}
	return nil
}

// writeLayout writes idx as the OCI layout OUT/oci, its one entry named
// NAME:VERSION for containerd (io.containerd.image.name) and VERSION for
// OCI tools (org.opencontainers.image.ref.name), and that layout as the
// archive OUT/plugd-image.tar.
func writeLayout(o options, idx v1.ImageIndex) error {
	dir := filepath.Join(o.out, "oci")
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	if err := p.AppendIndex(idx, layout.WithAnnotations(map[string]string{
		"io.containerd.image.name":          o.name + ":" + o.version,
		"org.opencontainers.image.ref.name": o.version,
	})); err != nil {
		return err
	}
	return tarDir(dir, filepath.Join(o.out, "plugd-image.tar"), o)
}

// tarDir writes the files under dir into the tar archive path, in name
// order, every time o.created, owned by root: the same layout gives the
// same bytes.
func tarDir(dir, path string, o options) error {
	var names []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		names = append(names, p)
		return nil
	})
	if err != nil {
		return err
	}
	slices.Sort(names)
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(f)
	for _, p := range names {
		if err := addFile(tw, dir, p, o); err != nil {
			f.Close()
			return err
		}
	}
	if err := tw.Close(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func addFile(tw *tar.Writer, dir, p string, o options) error {
	fi, err := os.Stat(p)
	if err != nil {
		return err
	}
	rel, err := filepath.Rel(dir, p)
	if err != nil {
		return err
	}
	h := &tar.Header{Name: filepath.ToSlash(rel), Mode: 0o644, ModTime: o.created, Format: tar.FormatPAX}
	if fi.IsDir() {
		h.Typeflag, h.Name, h.Mode = tar.TypeDir, h.Name+"/", 0o755
		return tw.WriteHeader(h)
	}
	h.Typeflag, h.Size = tar.TypeReg, fi.Size()
	if err := tw.WriteHeader(h); err != nil {
		return err
	}
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(tw, f)
	return err
}

// pushIndex pushes idx, and each image and layer in it, to ref, with the
// credentials docker login (or crane auth login) left in
// ~/.docker/config.json. A registry on loopback is spoken to over plain
// HTTP.
func pushIndex(idx v1.ImageIndex, ref string) error {
	r, err := name.ParseReference(ref)
	if err != nil {
		return fmt.Errorf("-push %q: %w", ref, err)
	}
	if err := remote.WriteIndex(r, idx, remote.WithAuthFromKeychain(authn.DefaultKeychain)); err != nil {
		return fmt.Errorf("pushing to %s: %w", r, err)
	}
	fmt.Fprintf(os.Stderr, "image: pushed %s\n", r)
	return nil
}
