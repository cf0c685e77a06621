#!/usr/bin/env bash
# Builds the local cluster's real node (kubelet, containerd, runc, CNI plugins) from Go modules into
# a cache outside the repository, skipping what is already there.
#
#   hack/build-node.sh        build what is missing; stdout carries only the node directory
#
# Layout of the printed directory ($GPUPLACE_CACHE/node), one directory per pinned release, so that
# moving one pin rebuilds only that component:
#   kubelet-<k8s>/kubelet                                  hack/k8s/go.mod's k8s.io/kubernetes
#   containerd-<v>/{containerd,containerd-shim-runc-v2,ctr}  hack/node.versions
#   runc-<v>/runc                                          hack/node.versions
#   cni-plugins-<v>/{bridge,host-local,loopback}           hack/node.versions
#   pause-<k8s>/pause                     the pod sandbox: Kubernetes' build/pause/linux/pause.c, static
#   gpu-probe-<hash>/gpu-probe            the workload (hack/gpu-probe; <hash> is of its sources)
# gpuplace_dev.localcluster.images packs the last two into OCI images when a node starts.
#
# runc is built with seccomp (containerd gives every pod sandbox a seccomp profile), which needs
# gcc and libseccomp's C headers; as root on Debian/Ubuntu the script installs libseccomp-dev and
# pkg-config with apt-get when they are missing.
# gpuplace_dev.localcluster.nodebinaries resolves the binaries by the same layout. Progress goes to
# stderr; concurrent runs wait for each other (flock); binaries move into place only when complete.
set -euo pipefail

log_prefix=node
# shellcheck source=hack/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

containerd_binaries=(containerd containerd-shim-runc-v2 ctr)
cni_binaries=(bridge host-local loopback)

# Everything runs inside main, so bash has read the whole file before a long build starts.
main() {
  here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
  k8s_version=$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ {print $2; exit}' "$here/k8s/go.mod")
  [ -n "$k8s_version" ] || die "$here/k8s/go.mod: no 'k8s.io/kubernetes vX.Y.Z' requirement"
  containerd_version=$(pin containerd)
  runc_version=$(pin runc)
  cni_version=$(pin cni_plugins)
  probe_hash=$(cd "$here/gpu-probe" && LC_ALL=C ls -1 | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-12)
  dra_hash=$(cd "$here/dra-driver" && LC_ALL=C ls -1 | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-12)

  cache=${GPUPLACE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpuplace}
  root="$cache/node"
  logs="$root/logs"
  if [ -z "$(missing)" ]; then
    echo "$root"
    return 0
  fi

  command -v go >/dev/null || die "go not found on PATH; install Go 1.25 or newer"
  mkdir -p "$root" "$logs"
  take_lock "$root/.build.lock" "$root"
  if [ -z "$(missing)" ]; then
    echo "$root"
    return 0
  fi

  log "building $(missing | tr '\n' ' ')into $root (a first build takes several minutes; logs in $logs)"
  bin=$root
  begin_staging
  local total_start=$SECONDS

  if [ ! -x "$root/kubelet-$k8s_version/kubelet" ]; then
    local minor=${k8s_version#v1.} ldflags="-s -w" pkg
    minor=${minor%%.*}
    # The same version stamp as the control plane's binaries: the Node reports the real release.
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
      ldflags+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
      ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
    done
    run_build "kubelet $k8s_version" "$logs/kubelet.log" \
      go_in "$here/k8s" build -v -trimpath -ldflags "$ldflags" -o "$staging/" ./cmd/kubelet
    place "kubelet-$k8s_version" kubelet
  fi

  if ! all_there "containerd-$containerd_version" "${containerd_binaries[@]}"; then
    local module=github.com/containerd/containerd/v2 name pkgs=()
    for name in "${containerd_binaries[@]}"; do pkgs+=("$module/cmd/$name@$containerd_version"); done
    # The storage drivers left out need C headers this build does without; the node uses overlayfs.
    # The shim is static like upstream's; the daemon needs no cgo either without those drivers.
    run_build "containerd $containerd_version" "$logs/containerd.log" \
      env GOBIN="$staging" GOFLAGS=-trimpath CGO_ENABLED=0 \
      go install -v -tags "no_btrfs no_devmapper no_zfs" \
      -ldflags "-s -w -X $module/version.Version=$containerd_version -X $module/version.Package=$module" \
      "${pkgs[@]}"
    place "containerd-$containerd_version" "${containerd_binaries[@]}"
  fi

  if [ ! -x "$root/runc-$runc_version/runc" ]; then
    need_libseccomp
    # runc's nsenter is C, and seccomp links libseccomp: this one needs cgo (and gcc).
    run_build "runc $runc_version" "$logs/runc.log" \
      env GOBIN="$staging" GOFLAGS=-trimpath CGO_ENABLED=1 \
      go install -v -tags seccomp -ldflags "-s -w -X main.version=${runc_version#v}" \
      "github.com/opencontainers/runc@$runc_version"
    place "runc-$runc_version" runc
  fi

  if ! all_there "cni-plugins-$cni_version" "${cni_binaries[@]}"; then
    local module=github.com/containernetworking/plugins name pkgs=()
    for name in "${cni_binaries[@]}"; do
      case $name in
        host-local) pkgs+=("$module/plugins/ipam/$name@$cni_version") ;;
        *) pkgs+=("$module/plugins/main/$name@$cni_version") ;;
      esac
    done
    run_build "CNI plugins $cni_version" "$logs/cni-plugins.log" \
      env GOBIN="$staging" GOFLAGS=-trimpath CGO_ENABLED=0 \
      go install -v \
      -ldflags "-s -w -X $module/pkg/utils/buildversion.BuildVersion=$cni_version" "${pkgs[@]}"
    place "cni-plugins-$cni_version" "${cni_binaries[@]}"
  fi

  if [ ! -x "$root/pause-$k8s_version/pause" ]; then
    command -v gcc >/dev/null || die "gcc not found on PATH; the pause image needs it (apt-get install gcc libc6-dev)"
    local dir
    dir=$(cd "$here/k8s" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)
    log "compiling pause (static) from $dir/build/pause/linux/pause.c"
    gcc -Os -Wall -Werror -static -DVERSION="$k8s_version" -o "$staging/pause" \
      "$dir/build/pause/linux/pause.c" >"$logs/pause.log" 2>&1 ||
      die "compiling pause failed (static linking needs libc6-dev); see $logs/pause.log"
    strip "$staging/pause" 2>/dev/null || true
    place "pause-$k8s_version" pause
  fi

  if [ ! -x "$root/gpu-probe-$probe_hash/gpu-probe" ]; then
    run_build "gpu-probe" "$logs/gpu-probe.log" \
      go_static "$here/gpu-probe" build -v -trimpath -ldflags "-s -w" -o "$staging/gpu-probe" .
    place "gpu-probe-$probe_hash" gpu-probe
  fi

  if [ ! -x "$root/dra-driver-$dra_hash/gpuplace-dra-driver" ]; then
    run_build "gpuplace-dra-driver (fake GPU DRA kubelet plugin)" "$logs/dra-driver.log" \
      go_dir "$here/dra-driver" build -v -o "$staging/gpuplace-dra-driver" .
    place "dra-driver-$dra_hash" gpuplace-dra-driver
  fi

  log "node components ready in $root ($((SECONDS - total_start))s)"
  echo "$root"
}

# pin KEY -> the release hack/node.versions pins for KEY.
pin() {
  local value
  value=$(awk -F= -v key="$1" '$1 == key {print $2; exit}' "$here/node.versions")
  [ -n "$value" ] || die "$here/node.versions: no '$1=vX.Y.Z' line"
  printf '%s\n' "$value"
}

# all_there DIR NAME... -> true when every NAME is an executable in $root/DIR.
all_there() {
  local dir=$1 name
  shift
  for name in "$@"; do [ -x "$root/$dir/$name" ] || return 1; done
}

# missing -> the component directories that are not complete yet, one a line.
missing() {
  all_there "kubelet-$k8s_version" kubelet || echo "kubelet-$k8s_version"
  all_there "containerd-$containerd_version" "${containerd_binaries[@]}" ||
    echo "containerd-$containerd_version"
  all_there "runc-$runc_version" runc || echo "runc-$runc_version"
  all_there "cni-plugins-$cni_version" "${cni_binaries[@]}" || echo "cni-plugins-$cni_version"
  all_there "pause-$k8s_version" pause || echo "pause-$k8s_version"
  all_there "gpu-probe-$probe_hash" gpu-probe || echo "gpu-probe-$probe_hash"
  all_there "dra-driver-$dra_hash" gpuplace-dra-driver || echo "dra-driver-$dra_hash"
}

# need_libseccomp -> libseccomp's headers are there (installed with apt-get as root if not).
need_libseccomp() {
  command -v gcc >/dev/null || die "gcc not found on PATH; runc needs it (apt-get install gcc libc6-dev)"
  if command -v pkg-config >/dev/null && pkg-config --exists libseccomp; then return 0; fi
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    log "installing libseccomp-dev and pkg-config (runc's seccomp support) with apt-get"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q libseccomp-dev pkg-config >"$logs/apt.log" 2>&1 ||
      { apt-get update -q >>"$logs/apt.log" 2>&1 &&
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q libseccomp-dev pkg-config >>"$logs/apt.log" 2>&1; } ||
      die "apt-get install libseccomp-dev pkg-config failed; see $logs/apt.log"
    return 0
  fi
  die "runc needs libseccomp's headers: install libseccomp-dev and pkg-config (Debian/Ubuntu) or libseccomp-devel (Fedora)"
}

# go_static DIR ARGS... -> `go ARGS` in DIR without cgo: a static binary for a scratch image.
go_static() {
  cd "$1"
  shift
  CGO_ENABLED=0 exec go "$@"
}

# go_dir DIR ARGS... -> go ARGS in DIR (the DRA driver links client-go: built like `go build`
# there, so a developer's build cache serves it).
go_dir() {
  cd "$1"
  shift
  exec go "$@"
}

# place DIR NAME... -> moves finished binaries from $staging into $root/DIR.
place() {
  local dir=$1 name
  shift
  mkdir -p "$root/$dir"
  for name in "$@"; do mv -f "$staging/$name" "$root/$dir/$name"; done
}

main "$@"
