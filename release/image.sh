#!/usr/bin/env bash
# image.sh VERSION [OUTDIR]: plugd's image for linux/amd64 and linux/arm64,
# built without Docker from the binaries release/package.sh left in
# OUTDIR/bin/linux_ARCH (run it first, with the same VERSION and OUTDIR,
# default dist):
#   image/oci/             the image index as an OCI image layout
#                          (crane push OUTDIR/image/oci REF)
#   image/plugd-image.tar  the same layout as an archive (ctr -n k8s.io
#                          images import, kind load image-archive), named
#                          IMAGE_NAME:VERSION (default ghcr.io/plugd/plugd)
# It prints the index's reference by digest. IMAGE_PUSH=REGISTRY/REPO:TAG
# pushes it too, with docker login's credentials (the release workflow
# does). IMAGE_ARCHES (default amd64 arm64) as for package.sh.
# The image is reproducible: every time in it is SOURCE_DATE_EPOCH
# (default: the last commit's time), its revision label REVISION (default:
# the checked-out commit), so the same binaries give the same digest.
set -euo pipefail
if [ $# -lt 1 ]; then
	echo "usage: $0 VERSION [OUTDIR]" >&2
	exit 2
fi
version=$1
root=$(cd "$(dirname "$0")/.." && pwd)
if [ ! -d "${2:-dist}/bin" ]; then
	echo "image.sh: no ${2:-dist}/bin: run release/package.sh $version ${2:-dist} first; it builds the image's binaries there" >&2
	exit 1
fi
out=$(cd "${2:-dist}" && pwd)
epoch=${SOURCE_DATE_EPOCH:-$(git -C "$root" log -1 --format=%ct)}
revision=${REVISION:-$(git -C "$root" rev-parse HEAD)}
platforms=$(printf 'linux/%s ' ${IMAGE_ARCHES:-amd64 arm64})
echo "image.sh: plugd $version for ${platforms% } from $out/bin (the first run compiles go-containerregistry: a minute)..." >&2
start=$SECONDS
mkdir -p "$out/image"
# The builder is a module of its own (release/image/go.mod): plugd's main
# module does not require go-containerregistry.
cd "$root/release/image"
go run . -version "$version" -bin "$out/bin" -out "$out/image" \
	-arch "${IMAGE_ARCHES:-amd64 arm64}" -name "${IMAGE_NAME:-ghcr.io/plugd/plugd}" \
	-revision "$revision" -epoch "$epoch" -push "${IMAGE_PUSH:-}"
echo "image.sh: done in $((SECONDS - start))s" >&2
