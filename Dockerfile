# syntax=docker/dockerfile:1
#
# plugd and plugctl in one image. Build from the repository root:
#   docker build -t plugd .
#   docker build --build-arg VERSION=v1.2.3 -t plugd:v1.2.3 .
# How to run it: deploy/README.md.

FROM golang:1.26 AS build
WORKDIR /src
# Modules first, in their own layer, so that editing the source does not
# download them again.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
# The version the binaries report (plugd version, plugctl version, GET
# /v1/version); each keeps its own variable.
ARG VERSION=devel
# CGO_ENABLED=0: a static binary, which the distroless static image needs (it
# has no libc). -trimpath: no build paths in the binary. -s: no symbol table.
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 go build -trimpath \
        -ldflags="-s -X github.com/plugd/plugd/cmd/plugd/internal/daemon.Version=${VERSION}" \
        -o /out/plugd ./cmd/plugd && \
    CGO_ENABLED=0 go build -trimpath \
        -ldflags="-s -X github.com/plugd/plugd/cmd/plugctl/internal/cli.Version=${VERSION}" \
        -o /out/plugctl ./cmd/plugctl

# Root, deliberately: not static-debian12:nonroot. Plugins' registration
# sockets (and the kubelet's registry directory) are owned by root, and
# connecting to a unix socket needs write permission on it, which a non-root
# user does not have. Run it with every capability dropped and a read-only
# root filesystem instead (deploy/kubernetes/daemonset.yaml does).
FROM gcr.io/distroless/static-debian12
COPY --from=build /out/plugd /out/plugctl /usr/local/bin/
USER 0:0
ENTRYPOINT ["/usr/local/bin/plugd"]
