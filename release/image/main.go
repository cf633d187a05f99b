// Command image builds plugd's multi-platform OCI image from binaries
// already built by release/build.sh, without Docker or any daemon: one
// layer per platform holding /usr/local/bin/plugd and plugctl, on no base
// (the binaries are static), and an image index over the platforms. It
// writes the index as an OCI image layout (a directory: crane push takes
// it) and the same layout as a tar archive (ctr images import and kind
// load image-archive take it), and pushes the index when asked.
//
// The image is reproducible: every time in it (the layer's files, the
// config's created, its history) is -epoch (SOURCE_DATE_EPOCH), and
// nothing else varies, so the same binaries give the same digest.
//
// It is a module of its own so that neither plugd's main module, which
// library users require, nor its tests depend on go-containerregistry.
// release/image.sh runs it; see docs/release.md.
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"time"
)

func main() {
	var o options
	flag.StringVar(&o.version, "version", "", "the version the binaries were stamped with (vX.Y.Z); the image's version label and tag")
	flag.StringVar(&o.binDir, "bin", "", "the directory holding linux_ARCH/plugd and linux_ARCH/plugctl for each -arch (release/package.sh's OUTDIR/bin)")
	flag.StringVar(&o.out, "out", "", "the directory to write the OCI layout (OUT/oci) and its archive (OUT/plugd-image.tar) into")
	arches := flag.String("arch", "amd64 arm64", "the image's Linux architectures, space-separated")
	flag.StringVar(&o.name, "name", "ghcr.io/plugd/plugd", "the repository the image is named in the archive (ctr and kind import it as NAME:VERSION)")
	flag.StringVar(&o.source, "source", "https://github.com/plugd/plugd", "the org.opencontainers.image.source label")
	flag.StringVar(&o.revision, "revision", "", "the commit the binaries were built from (org.opencontainers.image.revision)")
	epoch := flag.Int64("epoch", 0, "every time in the image, in seconds since 1970 (SOURCE_DATE_EPOCH)")
	push := flag.String("push", "", "a reference (REGISTRY/REPOSITORY:TAG) to push the index to, with the credentials of docker login")
	flag.Parse()
	o.arches = strings.Fields(*arches)
	o.created = time.Unix(*epoch, 0).UTC()
	if err := o.check(); err != nil {
		fmt.Fprintf(os.Stderr, "image: %v\n", err)
		flag.Usage()
		os.Exit(2)
	}
	if err := run(o, *push); err != nil {
		fmt.Fprintf(os.Stderr, "image: %v\n", err)
		os.Exit(1)
	}
}

// options says what image to build from which binaries.
type options struct {
	version, binDir, out   string
	arches                 []string
	name, source, revision string
	created                time.Time
}

func (o options) check() error {
	switch {
	case o.version == "":
		return fmt.Errorf("-version is required: the version the binaries were built with")
	case o.binDir == "":
		return fmt.Errorf("-bin is required: release/package.sh's OUTDIR/bin, holding linux_ARCH/plugd")
	case o.out == "":
		return fmt.Errorf("-out is required: where to write the image")
	case len(o.arches) == 0:
		return fmt.Errorf("-arch names no architecture")
	case o.revision == "":
		return fmt.Errorf("-revision is required: the commit the binaries were built from")
	}
	return nil
}

func run(o options, push string) error {
	idx, err := buildIndex(o)
	if err != nil {
		return err
	}
	d, err := idx.Digest()
	if err != nil {
		return err
	}
	if err := writeLayout(o, idx); err != nil {
		return err
	}
	fmt.Printf("%s@%s\n", o.name, d)
	if push == "" {
		return nil
	}
	return pushIndex(idx, push)
}
