#!/usr/bin/env bash
# Installs what the interop suite's servers in other gRPC stacks need, where
# it can: Python grpcio and its protobuf runtime for /usr/bin/python3
# (Debian's python3-grpcio python3-protobuf: as root), and Node's
# @grpc/grpc-js (npm ci in test/interop/node, locked by package-lock.json:
# as anyone). What is already there is left alone, so a second run costs
# nothing. Without them `go test ./...` skips those servers' tests and says
# so; with PLUGD_INTEROP=require (as .ci/run sets) it fails instead.
set -euo pipefail
cd "$(dirname "$0")"

missing=()
/usr/bin/python3 -c 'import grpc, google.protobuf' 2>/dev/null || missing+=(python3-grpcio python3-protobuf)
{ command -v node && command -v npm; } >/dev/null || missing+=(nodejs npm)
if [ ${#missing[@]} -gt 0 ]; then
	if [ "$(id -u)" != 0 ]; then
		echo "test/interop needs the Debian packages ${missing[*]}: run this script as root, or: sudo apt-get install ${missing[*]}" >&2
		exit 1
	fi
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

cd node
# npm writes node_modules/.package-lock.json at each install: newer than the
# lock file means installed from it.
if [ ! node_modules/.package-lock.json -nt package-lock.json ]; then
	npm ci --no-audit --no-fund --loglevel=error
fi
