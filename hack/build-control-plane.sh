#!/usr/bin/env bash
# Builds the local control plane (kube-apiserver, kube-controller-manager, kube-scheduler, kubectl,
# etcd, kwok) from Go modules into a cache outside the repository, skipping what is already there.
#
#   hack/build-control-plane.sh            # build what is missing, print the bin directory
#   GPUPLACE_CACHE=/path hack/build-control-plane.sh
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# Versions are read from the wrapper modules so that one place pins them.
k8s_version=$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ {print $2; exit}' "$here/k8s/go.mod")
etcd_version=$(grep -oE 'go.etcd.io/etcd/server/v3 v[^ ]+' "$here/etcd/go.mod" | head -n1 | cut -d" " -f2)
kwok_version=$(cat "$here/kwok.version")
cache=${GPUPLACE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpuplace}
bin="$cache/k8s-$k8s_version/bin"
mkdir -p "$bin"

log() { printf '[control-plane] %s\n' "$*" >&2; }

minor=${k8s_version#v1.}; minor=${minor%%.*}
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done

missing=()
for c in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
  [ -x "$bin/$c" ] || missing+=("./cmd/$c")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "building ${missing[*]#./cmd/} $k8s_version (first build takes a while; cached in $bin)"
  start=$SECONDS
  (cd "$here/k8s" && go build -trimpath -ldflags "$ldflags" -o "$bin/" "${missing[@]}")
  log "built in $((SECONDS - start))s"
fi

if [ ! -x "$bin/etcd" ]; then
  log "building etcd $etcd_version"
  start=$SECONDS
  (cd "$here/etcd" && go build -trimpath -ldflags "-s -w" -o "$bin/etcd" .)
  log "built in $((SECONDS - start))s"
fi

if [ ! -x "$bin/kwok" ]; then
  log "building kwok $kwok_version"
  start=$SECONDS
  GOBIN="$bin" GOFLAGS=-trimpath go install -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$kwok_version"
  log "built in $((SECONDS - start))s"
fi

echo "$bin"
