#!/usr/bin/env bash
# Builds the Argo Workflows components that the preflight tier runs (the workflow controller, out
# of cluster like ArgoCD's components, and argoexec, the executor every Workflow pod carries) from
# the argo-workflows Go module into a cache outside the repository, skipping what is already there.
# Copies the module's minimal CRDs and the executor's Role next to them.
#
#   hack/build-argo-workflows.sh        build what is missing; stdout carries only the directory
#
# Layout of the printed directory ($GPUPLACE_CACHE/argo-workflows-<version>):
#   bin/workflow-controller      runs on the host against the local apiserver
#   bin/argoexec                 static; gpuplace_dev.localargowf packs it into an image that the
#                                real node's containerd imports
#   crds/*.yaml                  manifests/base/crds/minimal of that release
#   rbac/executor-role.yaml      the Role a Workflow's pods run under (workflowtaskresults)
#   logs/                        the Go build logs
#   src/                         the module the binaries are built from (see below)
#
# hack/argo-workflows/version pins the release. v4.0.5 is the newest the module proxy serves and it
# is flagged with reported security vulnerabilities: it is for the development environment only
# (docs/preflight.md). `go list -m -versions github.com/argoproj/argo-workflows/v4` lists newer ones;
# move the pin when one appears. The module's go.mod has no replace directive, so both commands
# build from a copy of the module with its own go.mod and go.sum (cmd/argo, the CLI and UI server,
# does not: its UI is not in the module, and the tier does not need it). The copy, under src/, exists
# because the published v4.0.5 lacks workflow/executor/osspecific/signal_linux.go (argoexec then
# fails with "undefined: Setpgid"): the script adds hack/argo-workflows/signal_linux.go.txt there,
# the release's signal_darwin.go, which is POSIX. Drop it when a release carries the file.
set -euo pipefail

log_prefix=argo-workflows
# shellcheck source=hack/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

module=github.com/argoproj/argo-workflows/v4

# Everything runs inside main, so bash has read the whole file before a long build starts.
main() {
  here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
  version=$(tr -d '[:space:]' <"$here/argo-workflows/version")
  [ -n "$version" ] || die "$here/argo-workflows/version is empty"

  claim_release "argo-workflows-$version" crds rbac || return 0

  log "building Argo Workflows $version into $bin (a first build downloads several hundred MiB of modules and takes many minutes; logs in $logs)"
  begin_staging
  local total_start=$SECONDS
  # The module as published, copied out of the read-only module cache to add the missing file.
  local dir
  dir=$(GOFLAGS=-mod=mod go_module_dir "$root" "$module@$version")
  [ -d "$dir" ] || die "go mod download $module@$version gave no directory"
  local src="$root/src"
  rm -rf "$src"
  cp -R "$dir" "$src"
  chmod -R u+w "$src"
  local missing="$src/workflow/executor/osspecific/signal_linux.go"
  [ -e "$missing" ] || cp "$here/argo-workflows/signal_linux.go.txt" "$missing"

  # Both binaries are static (argoexec runs in a scratch image) and carry the release they are of.
  local ldflags="-s -w -X $module.version=$version"
  local name
  for name in argoexec workflow-controller; do
    if [ ! -x "$bin/$name" ]; then
      run_build "$name $version" "$logs/$name.log" \
        go_static "$src" build -v -trimpath -ldflags "$ldflags" -o "$staging/$name" "./cmd/$name"
      install_built "$name"
    fi
  done

  # The CRDs and the executor's Role of the same release.
  cp "$src"/manifests/base/crds/minimal/*.yaml "$root/crds/"
  rm -f "$root/crds/kustomization.yaml"
  cp "$src"/manifests/quick-start/base/executor/emissary/executor-role.yaml "$root/rbac/"
  chmod u+w "$root"/crds/*.yaml "$root"/rbac/*.yaml
  touch "$root/.complete-$version"
  log "Argo Workflows ready in $root ($((SECONDS - total_start))s)"
  echo "$root"
}

# go_static DIR ARGS... -> `go ARGS` in DIR without cgo (run_build starts it in a subshell).
go_static() {
  cd "$1"
  shift
  CGO_ENABLED=0 GOFLAGS="-mod=mod ${GOFLAGS:-}" exec go "$@"
}

# complete -> true when both binaries, the CRDs and the executor's Role are in place.
complete() {
  [ -f "$root/.complete-$version" ] && [ -x "$bin/workflow-controller" ] && [ -x "$bin/argoexec" ] &&
    [ -f "$root/crds/argoproj.io_workflows.yaml" ] && [ -f "$root/rbac/executor-role.yaml" ]
}

main "$@"
