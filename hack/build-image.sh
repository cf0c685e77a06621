#!/usr/bin/env bash
# `make image`: the gpuplace image from the Dockerfile, without a Docker engine, as a reproducible OCI
# archive; prints its path, size and digest (the manifest's, which `ctr images import` and the
# kubelet report), the last line being the path.
#
# - The base is made from Debian's packages by mmdebstrap (Debian 12 essential + python3 and
#   libstdc++6: Python 3.11, where the published base, python:3.12-slim-bookworm, has 3.12),
#   written as a one-layer OCI
#   archive by hack/oci.py. It is cached per package set and day.
# - buildah (Debian's package; --isolation chroot, vfs storage under the cache) builds the Dockerfile
#   with BASE_IMAGE pointing at it. pip installs gpuplace's dependencies from PyPI.
# - Reproducible: SOURCE_DATE_EPOCH is the commit's time (mmdebstrap, bytecode hashes, buildah's
#   --timestamp for every file and the image's creation time), and hack/oci.py repacks the layout
#   with sorted entries and zero times. The same commit, on the same day's packages, gives the same
#   digest.
#
# Environment: GPUPLACE_CACHE (default ~/.cache/gpuplace); IMAGE_NAME (default
# gpuplace.local/gpuplace:<version>); IMAGE_FORCE=1 builds even when the archive in the cache was
# built from the same sources and base.
set -euo pipefail
log_prefix=image
# shellcheck source=hack/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=${GPUPLACE_CACHE:-$HOME/.cache/gpuplace}/image
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$repo/pyproject.toml" | head -1)
name=${IMAGE_NAME:-gpuplace.local/gpuplace:$version}
out=$cache/gpuplace-$version.oci.tar
mkdir -p "$cache"
take_lock "$cache/.lock" "$cache"

"$(dirname "${BASH_SOURCE[0]}")/ensure-apt.sh" mmdebstrap buildah

# The commit's time, or (uncommitted changes, no git) a fixed one: reproducible either way.
epoch=$(git -C "$repo" log -1 --format=%ct 2>/dev/null || echo 1700000000)
export SOURCE_DATE_EPOCH=$epoch

# libstdc++6: grpcio (the agent's kubelet PodResources client) is C++; Debian images that carry
# apt (python:3.12-slim-bookworm) have it already.
packages=python3,python3-venv,libstdc++6
base_key=$(printf '%s %s %s' "$packages" "$(date -u +%Y%m%d)" "$epoch" | sha256sum | cut -c1-12)
base=$cache/base-$base_key.oci.tar
if [ ! -s "$base" ]; then
  start=$SECONDS
  log "making the base with mmdebstrap (Debian 12 essential + $packages)"
  rootfs=$cache/base-$base_key.rootfs.tar
  mmdebstrap --quiet --variant=essential --include="$packages" \
    --aptopt='Acquire::Check-Valid-Until "false"' \
    --customize-hook='rm -rf "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/* "$1"/var/log/*' \
    bookworm "$rootfs" >"$cache/mmdebstrap.log" 2>&1 ||
    { tail -n 30 "$cache/mmdebstrap.log" >&2; die "mmdebstrap failed"; }
  python3 "$repo/hack/oci.py" base "$rootfs" "gpuplace.local/base:$base_key" "$base"
  rm -f "$rootfs"
  find "$cache" -maxdepth 1 -name 'base-*.oci.tar' ! -name "base-$base_key.oci.tar" -delete
  log "base made in $((SECONDS - start))s"
fi

storage=(--root "$cache/storage" --runroot "$cache/run" --storage-driver vfs)
context=$(mktemp -d "$cache/context.XXXXXX")
layout=$(mktemp -d "$cache/layout.XXXXXX")
trap 'rm -rf "$context" "$layout"' EXIT
# Only what the Dockerfile copies, as committed or as in the work tree (one copy, no .venv).
tar -C "$repo" --exclude=__pycache__ --exclude="*.pyc" -cf - \
  Dockerfile pyproject.toml README.md placement kubeio controller webhook agent gpuplace |
  tar -C "$context" -xf -

# pip in the build trusts what this machine trusts (a TLS-inspecting proxy's CA, say).
secret=()
for bundle in "${PIP_CERT:-}" "${SSL_CERT_FILE:-}" /etc/ssl/certs/ca-certificates.crt; do
  if [ -n "$bundle" ] && [ -s "$bundle" ]; then
    secret=(--secret "id=ca-certificates,src=$bundle")
    break
  fi
done

# The same sources, base and name as the archive in the cache: nothing to build.
key=$( { (cd "$context" && find . -type f -print0 | sort -z | xargs -0 sha256sum); echo "$base_key $name $epoch"; } | sha256sum | cut -c1-64)
if [ "${IMAGE_FORCE:-0}" != 1 ] && [ -s "$out" ] && [ "$(cat "$out.key" 2>/dev/null)" = "$key" ]; then
  log "$out is built from these sources already"
else
start=$SECONDS
log "building $name with buildah (base $(python3 "$repo/hack/oci.py" digest "$base"))"
buildah "${storage[@]}" bud --quiet --isolation chroot --layers=false \
  --timestamp "$epoch" --build-arg "SOURCE_DATE_EPOCH=$epoch" \
  --build-arg "BASE_IMAGE=oci-archive:$base" \
  "${secret[@]}" \
  -f "$context/Dockerfile" -t "$name" "$context" >"$cache/buildah.log" 2>&1 ||
  { tail -n 40 "$cache/buildah.log" >&2; die "buildah bud failed"; }
buildah "${storage[@]}" push --quiet --disable-compression "$name" "oci:$layout" >>"$cache/buildah.log" 2>&1 ||
  { tail -n 20 "$cache/buildah.log" >&2; die "buildah push failed"; }
buildah "${storage[@]}" rmi --all --force >/dev/null 2>&1 || true
python3 "$repo/hack/oci.py" pack "$layout" "$name" "$out"
echo "$key" >"$out.key"
log "built in $((SECONDS - start))s"
fi

digest=$(python3 "$repo/hack/oci.py" digest "$out")
size=$(du -h "$out" | cut -f1)
echo "image:  $name"
echo "digest: $digest"
echo "id:     $(python3 "$repo/hack/oci.py" id "$out")"
echo "size:   $size"
echo "$out"
