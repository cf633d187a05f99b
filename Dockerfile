# syntax=docker/dockerfile:1
#
# plugd and plugctl in one image, for linux/amd64 and linux/arm64. Build
# from the repository root:
#   docker build -t plugd .
#   docker buildx build --platform linux/amd64,linux/arm64 --build-arg VERSION=v1.2.3 -t ghcr.io/plugd/plugd:v1.2.3 --push .
# How to run it: deploy/README.md; how a release is made: docs/release.md.

# The compiler runs on the builder's own platform and cross-compiles (Go
# needs no emulator for that); only the last stage is the target's. The
# Go release is pinned to go.mod's go line (test/deploy checks they
# agree), so that the image's binaries are built by the Go the release's
# SBOM (go version -m) names, and a floating tag never changes them.
FROM --platform=$BUILDPLATFORM golang:1.26.8 AS build
WORKDIR /src
# Modules first, in their own layer, so that editing the source does not
# download them again.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
# The version the binaries report (plugd version, plugctl version, GET
# /v1/version).
ARG VERSION=devel
# Set by buildx for each platform of --platform; plain docker build sets
# them to the builder's.
ARG TARGETOS
ARG TARGETARCH
# release/build.sh: static (CGO off: distroless static has no libc),
# -trimpath, stripped, version-stamped; the release builds the same way.
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    release/build.sh /out "$TARGETOS" "$TARGETARCH" "$VERSION" plugd plugctl

# Root, deliberately: not static-debian12:nonroot. Plugins' registration
# sockets (and the kubelet's registry directory) are owned by root, and
# connecting to a unix socket needs write permission on it, which a non-root
# user does not have. Run it with every capability dropped and a read-only
# root filesystem instead (deploy/kubernetes/daemonset.yaml does).
FROM gcr.io/distroless/static-debian12
COPY --from=build /out/plugd /out/plugctl /usr/local/bin/
USER 0:0
ENTRYPOINT ["/usr/local/bin/plugd"]
