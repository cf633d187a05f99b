#!/usr/bin/env bash
# package.sh VERSION [OUTDIR]: the release's files, in OUTDIR (default dist):
#   kubectl-plugd_VERSION_OS_ARCH.tar.gz   the kubectl plugin, per platform
#   checksums.txt                          sha256 of every archive (sha256sum -c)
#   plugd.yaml                             the krew manifest (.krew.yaml rendered)
#   bin/OS_ARCH/                           plugd, plugctl, kubectl-plugd for the
#                                          image's platforms (linux amd64, arm64)
#   sbom/NAME_OS_ARCH.txt                  each binary's modules (go version -m)
# The archives are reproducible: the same source and Go give the same
# bytes, so the checksums can be checked by building again.
# PLATFORMS (space-separated OS/ARCH) narrows the plugin's platforms, and
# the krew manifest to them; IMAGE_ARCHES (default amd64 arm64) the image's.
# Each step says on standard error what it builds before it starts, and
# how long it took: the first build on a cold cache compiles every module
# for every platform (about 7 minutes on 2 cores), later ones take seconds.
set -euo pipefail
if [ $# -lt 1 ]; then
	echo "usage: $0 VERSION [OUTDIR]" >&2
	exit 2
fi
version=$1
root=$(cd "$(dirname "$0")/.." && pwd)
out=$(mkdir -p "${2:-dist}" && cd "${2:-dist}" && pwd)
platforms=${PLATFORMS:-linux/amd64 linux/arm64 darwin/amd64 darwin/arm64 windows/amd64}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
start=$SECONDS
# step N WHAT: says that step N of the total begins; done says it ended.
total=$(($(wc -w <<<"$platforms") + $(wc -w <<<"${IMAGE_ARCHES:-amd64 arm64}") + 1))
step() {
	step_start=$SECONDS
	echo "package.sh: [$1/$total] $2..." >&2
}
done_step() {
	echo "package.sh:        done in $((SECONDS - step_start))s" >&2
}
echo "package.sh: release $version, $total steps; the first run on a cold cache compiles every module for each platform: minutes, not seconds" >&2
n=0
mkdir -p "$out/sbom"
: >"$out/checksums.txt"

# The kubectl plugin, one archive per platform.
for p in $platforms; do
	os=${p%/*} arch=${p#*/}
	dir=$work/$os-$arch
	n=$((n + 1))
	step $n "kubectl-plugd for $os/$arch: build, SBOM, archive"
	"$root/release/build.sh" "$dir" "$os" "$arch" "$version" kubectl-plugd
	exe=kubectl-plugd
	[ "$os" = windows ] && exe=kubectl-plugd.exe
	go version -m "$dir/$exe" >"$out/sbom/kubectl-plugd_${os}_${arch}.txt"
	archive=kubectl-plugd_${version}_${os}_${arch}.tar.gz
	tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$dir" -cf - "$exe" | gzip -n >"$out/$archive"
	(cd "$out" && sha256sum "$archive" >>checksums.txt)
	done_step
done

# The image's binaries, and what they are made of.
for arch in ${IMAGE_ARCHES:-amd64 arm64}; do
	n=$((n + 1))
	step $n "plugd, plugctl, kubectl-plugd for the image's linux/$arch: build, SBOM"
	"$root/release/build.sh" "$out/bin/linux_$arch" linux "$arch" "$version"
	for b in plugd plugctl kubectl-plugd; do
		go version -m "$out/bin/linux_$arch/$b" >"$out/sbom/${b}_linux_${arch}.txt"
	done
	done_step
done

# The krew manifest: each addURIAndSha line becomes the archive's uri and
# sha256. A platform whose archive was not built is an error, unless
# PLATFORMS left it out on purpose: then the manifest leaves it out too.
n=$((n + 1))
step $n "the krew manifest"
partial=0
[ -n "${PLATFORMS:-}" ] && partial=1
awk -v version="$version" -v sums="$out/checksums.txt" -v partial="$partial" '
BEGIN { keep = 1; while ((getline line < sums) > 0) { split(line, f, "  "); sha[f[2]] = f[1] } }
function flush() { if (keep) printf "%s", item; item = ""; keep = 1 }
/^#/ { next }
{ gsub(/\{\{ \.TagName \}\}/, version) }
/^    - selector:/ { flush(); inItem = 1 }
/addURIAndSha/ {
	match($0, /"[^"]+"/); url = substr($0, RSTART + 1, RLENGTH - 2)
	n = split(url, parts, "/"); file = parts[n]
	indent = $0; sub(/[^ ].*/, "", indent)
	if (file in sha) { item = item indent "uri: " url "\n" indent "sha256: " sha[file] "\n"; next }
	if (!partial) { print "package.sh: no archive " file " for the krew manifest" > "/dev/stderr"; exit 1 }
	keep = 0; next
}
inItem { item = item $0 "\n"; next }
{ print }
END { flush() }' "$root/.krew.yaml" >"$out/plugd.yaml"
done_step
echo "package.sh: done in $((SECONDS - start))s" >&2
echo "release $version in $out:"
(cd "$out" && ls -1 ./*.tar.gz checksums.txt plugd.yaml)
