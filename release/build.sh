#!/usr/bin/env bash
# build.sh OUTDIR GOOS GOARCH VERSION [COMMAND...]: plugd's binaries for one
# platform, as the image and the release ship them: static (CGO off, so
# that they run on distroless/static and any Linux), without build paths
# (-trimpath) or symbol tables (-s -w), each stamped with VERSION (its
# version command, plugd's /v1/version, the User-Agent of the plugins'
# API clients). COMMAND defaults to plugd plugctl kubectl-plugd.
# The Dockerfile runs it with buildx's TARGETOS and TARGETARCH.
set -euo pipefail
if [ $# -lt 4 ]; then
	echo "usage: $0 OUTDIR GOOS GOARCH VERSION [COMMAND...]" >&2
	exit 2
fi
out=$1 goos=$2 goarch=$3 version=$4
shift 4
commands=("$@")
[ ${#commands[@]} -gt 0 ] || commands=(plugd plugctl kubectl-plugd)
cd "$(dirname "$0")/.."
mod=github.com/plugd/plugd
# Each program keeps its own version variable; -X for a package a binary
# does not link is ignored.
ldflags="-s -w -X $mod/cmd/internal/version.Stamped=$version"
pkgs=()
for c in "${commands[@]}"; do pkgs+=("./cmd/$c"); done
mkdir -p "$out"
CGO_ENABLED=0 GOOS=$goos GOARCH=$goarch go build -trimpath -ldflags="$ldflags" -o "$out/" "${pkgs[@]}"
