#!/usr/bin/env bash
# Builds the ArgoCD components that `make e2e-argocd` and `gpuplace demo --argocd` run out of
# cluster (application-controller, repo-server, applicationset-controller) from the argo-cd Go
# module, plus the kustomize the repo-server renders with, into a cache outside the repository,
# skipping what is already there. Copies the matching CRDs next to them.
#
#   hack/build-argocd.sh        build what is missing; stdout carries only the ArgoCD directory
#
# Layout of the printed directory ($GPUPLACE_CACHE/argocd-<version>):
#   bin/argocd                            one binary; the component is the name it is called by
#   bin/argocd-application-controller     symlinks to bin/argocd
#   bin/argocd-repo-server
#   bin/argocd-applicationset-controller
#   bin/argocd-git-ask-pass
#   bin/kustomize
#   crds/*.yaml                           Application, ApplicationSet, AppProject of that release
#
# hack/argocd/go.mod pins the release: v3.2.11, the newest that builds from the module proxy alone.
# From v3.3 on, argo-cd builds gitops-engine from a directory of its repository that no published
# module version carries; v3.2.12 calls a settings.ValidateExternalURL that its module lacks.
# hack/argocd/kustomize.version pins kustomize to the release that argo-cd's kustomize API
# dependency (sigs.k8s.io/kustomize/api v0.20.1) belongs to.
set -euo pipefail

log_prefix=argocd
# shellcheck source=hack/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

components=(argocd-application-controller argocd-repo-server argocd-applicationset-controller
  argocd-git-ask-pass)

# Everything runs inside main, so bash has read the whole file before a long build starts.
main() {
  here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
  local version kustomize_version
  version=$(go_version github.com/argoproj/argo-cd/v3 "$here/argocd/go.mod")
  kustomize_version=$(tr -d '[:space:]' <"$here/argocd/kustomize.version")
  [ -n "$version" ] || die "$here/argocd/go.mod: no 'github.com/argoproj/argo-cd/v3 vX.Y.Z' requirement"
  [ -n "$kustomize_version" ] || die "$here/argocd/kustomize.version is empty"

  claim_release "argocd-$version" crds || return 0

  log "building ArgoCD $version and kustomize $kustomize_version into $bin (a first build downloads about 1.3 GiB of modules and takes several minutes; logs in $logs)"
  begin_staging
  local total_start=$SECONDS

  # The directory is per release, so a binary found there is of that release.
  if [ ! -x "$bin/argocd" ]; then
    run_build "argo-cd $version" "$logs/argocd.log" \
      go_in "$here/argocd" build -v -trimpath \
      -ldflags "-s -w -X github.com/argoproj/argo-cd/v3/common.version=${version#v}" \
      -o "$staging/argocd" .
    install_built argocd
  fi
  local name
  for name in "${components[@]}"; do ln -sfn argocd "$bin/$name"; done

  if [ ! -x "$bin/kustomize" ]; then
    run_build "kustomize $kustomize_version" "$logs/kustomize.log" \
      env GOBIN="$staging" GOFLAGS=-trimpath \
      go install -v -ldflags "-s -w -X sigs.k8s.io/kustomize/api/provenance.version=kustomize/$kustomize_version" \
      "sigs.k8s.io/kustomize/kustomize/v5@$kustomize_version"
    install_built kustomize
  fi

  # The CRDs of the same release, from the module the binary was built from.
  local dir
  dir=$(cd "$here/argocd" && go list -m -f '{{.Dir}}' github.com/argoproj/argo-cd/v3)
  cp "$dir"/manifests/crds/application-crd.yaml "$dir"/manifests/crds/applicationset-crd.yaml \
    "$dir"/manifests/crds/appproject-crd.yaml "$root/crds/"
  chmod u+w "$root"/crds/*.yaml
  touch "$root/.complete-$version"
  log "ArgoCD ready in $root ($((SECONDS - total_start))s)"
  echo "$root"
}

# complete -> true when the binaries, the component links and the CRDs are all in place.
complete() {
  [ -f "$root/.complete-$version" ] && [ -x "$bin/argocd" ] && [ -x "$bin/kustomize" ] &&
    [ -L "$bin/argocd-repo-server" ] && [ -f "$root/crds/application-crd.yaml" ]
}

main "$@"
