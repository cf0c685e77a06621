#!/usr/bin/env bash
# Builds the controller managers of JobSet and LeaderWorkerSet, the training operators whose pods
# the training-operator integration tests place by rank, from their published Go modules into a
# cache outside the repository, skipping what is already there; copies their CRDs beside them.
#
#   hack/build-training-operators.sh     build what is missing; stdout carries only the directory
#
# Layout of the printed directory ($GPUPLACE_CACHE/training-operators-<jobset>-<lws>):
#   bin/jobset-controller   sigs.k8s.io/jobset (the module's main package)
#   bin/lws-controller      sigs.k8s.io/lws/cmd
#   crds/jobset/*.yaml      the module's config/components/crd/bases
#   crds/lws/*.yaml         the module's config/crd/bases
#   webhook/jobset/         the module's config/components/webhook (a kustomization)
#   webhook/lws/            the module's config/webhook (a kustomization)
#
# hack/training-operators/go.mod pins both releases in one build list (tools.go imports their main
# packages). The module proxy serves their versions but not their version lists, so `go install
# pkg@version` (which reads the list to check deprecations) fails where a build inside this module
# does not.
set -euo pipefail

log_prefix=training-operators
# shellcheck source=hack/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

main() {
  here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
  local mod="$here/training-operators"
  jobset=$(go_version sigs.k8s.io/jobset "$mod/go.mod")
  lws=$(go_version sigs.k8s.io/lws "$mod/go.mod")
  [ -n "$jobset" ] && [ -n "$lws" ] || die "$mod/go.mod: no sigs.k8s.io/jobset or sigs.k8s.io/lws requirement"

  claim_release "training-operators-$jobset-$lws" crds/jobset crds/lws webhook || return 0

  log "building JobSet $jobset and LeaderWorkerSet $lws into $bin (logs in $logs)"
  begin_staging
  local total_start=$SECONDS
  if [ ! -x "$bin/jobset-controller" ]; then
    run_build "jobset $jobset" "$logs/jobset.log" \
      go_in "$mod" build -v -trimpath -ldflags "-s -w" -o "$staging/jobset-controller" sigs.k8s.io/jobset
    install_built jobset-controller
  fi
  if [ ! -x "$bin/lws-controller" ]; then
    run_build "lws $lws" "$logs/lws.log" \
      go_in "$mod" build -v -trimpath -ldflags "-s -w" -o "$staging/lws-controller" sigs.k8s.io/lws/cmd
    install_built lws-controller
  fi

  local dir
  dir=$(go_module_dir "$mod" "sigs.k8s.io/jobset@$jobset")
  cp "$dir"/config/components/crd/bases/*.yaml "$root/crds/jobset/"
  rm -rf "$root/webhook/jobset" && cp -R "$dir/config/components/webhook" "$root/webhook/jobset"
  dir=$(go_module_dir "$mod" "sigs.k8s.io/lws@$lws")
  cp "$dir"/config/crd/bases/*.yaml "$root/crds/lws/"
  rm -rf "$root/webhook/lws" && cp -R "$dir/config/webhook" "$root/webhook/lws"
  chmod -R u+w "$root/crds" "$root/webhook"
  touch "$root/.complete"
  log "JobSet and LeaderWorkerSet ready in $root ($((SECONDS - total_start))s)"
  echo "$root"
}

complete() {
  [ -f "$root/.complete" ] && [ -x "$bin/jobset-controller" ] && [ -x "$bin/lws-controller" ] &&
    ls "$root"/crds/jobset/*.yaml "$root"/crds/lws/*.yaml >/dev/null 2>&1 &&
    [ -f "$root/webhook/jobset/kustomization.yaml" ] && [ -f "$root/webhook/lws/kustomization.yaml" ]
}

main "$@"
