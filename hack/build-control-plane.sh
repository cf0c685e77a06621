#!/usr/bin/env bash
# Builds the local control plane (kube-apiserver, kube-controller-manager, kube-scheduler, kubectl,
# etcd, kwok) from Go modules into a cache outside the repository, skipping what is already there.
#
#   hack/build-control-plane.sh        build what is missing; stdout carries only the bin directory
#
# Environment:
#   GPUPLACE_CACHE=/path       cache root (default ${XDG_CACHE_HOME:-~/.cache}/gpuplace); binaries go
#                              to $GPUPLACE_CACHE/k8s-<version>/bin, build logs to .../logs
#   KUBEBUILDER_ASSETS=/dir    binaries found in /dir (envtest layout: etcd, kube-apiserver, kubectl)
#                              are used as they are and not built
#   TEST_ASSET_KUBE_APISERVER, TEST_ASSET_KUBE_CONTROLLER_MANAGER, TEST_ASSET_KUBE_SCHEDULER,
#   TEST_ASSET_KUBECTL, TEST_ASSET_ETCD, TEST_ASSET_KWOK
#                              path of one component's binary; it is used and not built
#
# Progress goes to stderr. Concurrent runs wait for each other (flock), and binaries are moved into
# place only when complete, so an interrupted build never leaves a half-written binary behind.
# gpuplace_dev.localcluster.binaries resolves binaries by the same rules.
set -euo pipefail

k8s_components=(kube-apiserver kube-controller-manager kube-scheduler kubectl)

log_prefix=control-plane
# shellcheck source=hack/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# override NAME -> prints the binary to use instead of building NAME, or nothing.
override() {
  local name=$1 var path
  var="TEST_ASSET_$(printf '%s' "$name" | tr 'a-z-' 'A-Z_')"
  path=${!var:-}
  if [ -n "$path" ]; then
    [ -x "$path" ] || die "$var=$path is not an executable file; fix the path or unset $var"
    printf '%s\n' "$path"
  elif [ -n "${KUBEBUILDER_ASSETS:-}" ] && [ -x "$KUBEBUILDER_ASSETS/$name" ]; then
    printf '%s\n' "$KUBEBUILDER_ASSETS/$name"
  fi
}

# built NAME -> true when the cache holds NAME at the pinned version. The Kubernetes binaries live
# in a versioned directory; etcd and kwok are pinned separately, so ask them.
built() {
  local name=$1 reported
  [ -x "$bin/$name" ] || return 1
  # Capture first: piping into `grep -q` could kill the binary with SIGPIPE and, under pipefail,
  # fail the check at random.
  case $name in
    etcd)
      reported=$("$bin/etcd" --version 2>/dev/null) || return 1
      [[ $reported == *"etcd Version: ${etcd_version#v}"$'\n'* ]]
      ;;
    kwok)
      reported=$("$bin/kwok" --version 2>/dev/null) || return 1
      [[ $reported == "kwok version $kwok_version "* ]]
      ;;
    *) true ;;
  esac
}

# wanted NAME... -> the names among NAME... that are neither overridden nor built.
wanted() {
  local name
  for name in "$@"; do
    if [ -z "$(override "$name")" ] && ! built "$name"; then printf '%s\n' "$name"; fi
  done
}

# Everything runs inside main, so bash has read the whole file before it starts: editing the script
# (a git pull, say) while a long build runs cannot change what the running build executes.
main() {
  here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
  # Versions are read from the wrapper modules so that one place pins them.
  k8s_version=$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ {print $2; exit}' "$here/k8s/go.mod")
  etcd_version=$(go_version go.etcd.io/etcd/server/v3 "$here/etcd/go.mod")
  kwok_version=$(tr -d '[:space:]' <"$here/kwok.version")
  [ -n "$k8s_version" ] || die "$here/k8s/go.mod: no 'k8s.io/kubernetes vX.Y.Z' requirement"
  [ -n "$etcd_version" ] || die "$here/etcd/go.mod: no 'go.etcd.io/etcd/server/v3 vX.Y.Z' requirement"
  [ -n "$kwok_version" ] || die "$here/kwok.version is empty; write the kwok release there (v0.7.0)"

  cache=${GPUPLACE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpuplace}
  bin="$cache/k8s-$k8s_version/bin"
  logs="$cache/k8s-$k8s_version/logs"

  # Check overrides here, in this shell, so that a bad path stops the script (not just a subshell).
  local name
  for name in "${k8s_components[@]}" etcd kwok; do override "$name" >/dev/null; done
  local missing
  mapfile -t missing < <(wanted "${k8s_components[@]}" etcd kwok)
  if [ ${#missing[@]} -eq 0 ]; then
    echo "$bin"
    return 0
  fi

  command -v go >/dev/null ||
    die "go not found on PATH; install Go 1.25 or newer, or point KUBEBUILDER_ASSETS / TEST_ASSET_* at prebuilt binaries"
  mkdir -p "$bin" "$logs"

  # One build at a time per cache; whoever waited re-checks what is still missing afterwards.
  take_lock "$cache/k8s-$k8s_version/.build.lock" "$cache"
  mapfile -t missing < <(wanted "${k8s_components[@]}" etcd kwok)
  if [ ${#missing[@]} -eq 0 ]; then
    echo "$bin"
    return 0
  fi

  log "building ${missing[*]} into $bin (a first build takes several minutes; logs in $logs)"
  begin_staging
  local total_start=$SECONDS

  local k8s_missing
  mapfile -t k8s_missing < <(wanted "${k8s_components[@]}")
  if [ ${#k8s_missing[@]} -gt 0 ]; then
    local minor=${k8s_version#v1.} ldflags="-s -w" pkg pkgs=()
    minor=${minor%%.*}
    # Stamp the version as the upstream release build does, so /version reports the real release.
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
      ldflags+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
      ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
    done
    for name in "${k8s_missing[@]}"; do pkgs+=("./cmd/$name"); done
    run_build "kubernetes $k8s_version" "$logs/kubernetes.log" \
      go_in "$here/k8s" build -v -trimpath -ldflags "$ldflags" -o "$staging/" "${pkgs[@]}"
    install_built "${k8s_missing[@]}"
  fi

  if [ -n "$(wanted etcd)" ]; then
    run_build "etcd $etcd_version" "$logs/etcd.log" \
      go_in "$here/etcd" build -v -trimpath -ldflags "-s -w" -o "$staging/etcd" .
    install_built etcd
  fi

  if [ -n "$(wanted kwok)" ]; then
    run_build "kwok $kwok_version" "$logs/kwok.log" \
      env GOBIN="$staging" GOFLAGS=-trimpath \
      go install -v -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$kwok_version"
    install_built kwok
  fi

  log "control plane ready in $bin ($((SECONDS - total_start))s)"
  echo "$bin"
}

main "$@"
