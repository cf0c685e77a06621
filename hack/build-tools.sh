#!/usr/bin/env bash
# Builds the packaging tools (helm) from Go modules and fetches the third-party CRDs that the chart,
# argocd/ and the preflight Workflow are checked against, into a cache outside the repository,
# skipping what is already there. The Go module proxy is the only network it needs.
#
#   hack/build-tools.sh            # build/fetch what is missing, print the tools directory
#   GPUPLACE_CACHE=/path hack/build-tools.sh
#
# Layout of the printed directory:
#   bin/helm
#   crds/argocd/*.yaml             Application, ApplicationSet, AppProject (argo-cd manifests/crds)
#   crds/argo-workflows/*.yaml     Workflow (the full CRD, with the OpenAPI schema)
#   crds/cert-manager/*.yaml       Certificate, Issuer
#   crds/prometheus-operator/*.yaml  ServiceMonitor, PrometheusRule
set -euo pipefail

# One place pins every version. ArgoCD's is the release hack/build-argocd.sh builds (pinned in
# hack/argocd/go.mod), so manifests are checked against the CRDs of the ArgoCD that runs them.
helm_version=v3.22.0
argocd_version=$(awk '$1 == "require" && $2 == "github.com/argoproj/argo-cd/v3" {print $3; exit}
                      $1 == "github.com/argoproj/argo-cd/v3" {print $2; exit}' \
  "$(dirname "${BASH_SOURCE[0]}")/argocd/go.mod")
argo_workflows_version=v3.7.18 # the Workflow schema the argo-workflows 6.7 Python SDK targets
cert_manager_version=v1.21.2
prometheus_operator_version=v0.85.0

cache=${GPUPLACE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpuplace}
tools="$cache/tools"
mkdir -p "$tools/bin" "$tools/crds"
# Test sessions may start this at the same time; one builds, the others wait and reuse.
exec 9>"$tools/.lock"
flock 9

log() { printf '[tools] %s\n' "$*" >&2; }

# The module's directory in the module cache (downloads it through the proxy when missing).
module_dir() {
  local json dir
  json=$(cd "$tools" && GOFLAGS=-mod=mod go mod download -json "$1")
  dir=$(printf '%s\n' "$json" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  if [ -z "$dir" ]; then
    printf '%s\n' "$json" >&2
    log "could not download $1"
    return 1
  fi
  printf '%s\n' "$dir"
}

# Copies the named files of a module into crds/<name>, once per version.
fetch_crds() {
  local name=$1 module=$2 subdir=$3
  shift 3
  local dest="$tools/crds/$name" stamp="$tools/crds/$name/.fetched"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$module $subdir $*" ]; then
    return 0
  fi
  log "fetching $name CRDs from $module"
  local dir
  dir=$(module_dir "$module")
  rm -rf "$dest"
  mkdir -p "$dest"
  local file
  for file in "$@"; do
    install -m 0644 "$dir/$subdir/$file" "$dest/$file"
  done
  printf '%s' "$module $subdir $*" >"$stamp"
}

helm_bin="$tools/bin/helm"
if [ ! -x "$helm_bin" ] || ! "$helm_bin" version --template '{{.Version}}' 2>/dev/null | grep -qx "$helm_version"; then
  log "building helm $helm_version (first build takes a few minutes; cached in $tools/bin)"
  start=$SECONDS
  helm_dir=$(module_dir "helm.sh/helm/v3@$helm_version")
  # Stamp the version and the Kubernetes version helm assumes for `helm template`
  # (.Capabilities.KubeVersion), as helm's own Makefile does from its client-go dependency.
  client_go=$(awk '$1 == "k8s.io/client-go" {print $2; exit}' "$helm_dir/go.mod")
  k8s_minor=${client_go#v0.}
  k8s_minor=${k8s_minor%%.*}
  ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$helm_version"
  ldflags+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
  for pkg in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
    ldflags+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$k8s_minor"
  done
  GOBIN="$tools/bin" GOFLAGS=-trimpath CGO_ENABLED=0 \
    go install -ldflags "$ldflags" "helm.sh/helm/v3/cmd/helm@$helm_version"
  log "built in $((SECONDS - start))s"
fi

fetch_crds argocd "github.com/argoproj/argo-cd/v3@$argocd_version" manifests/crds \
  application-crd.yaml applicationset-crd.yaml appproject-crd.yaml
fetch_crds argo-workflows "github.com/argoproj/argo-workflows/v3@$argo_workflows_version" \
  manifests/base/crds/full argoproj.io_workflows.yaml
fetch_crds cert-manager "github.com/cert-manager/cert-manager@$cert_manager_version" deploy/crds \
  cert-manager.io_certificates.yaml cert-manager.io_issuers.yaml
fetch_crds prometheus-operator \
  "github.com/prometheus-operator/prometheus-operator@$prometheus_operator_version" \
  example/prometheus-operator-crd monitoring.coreos.com_servicemonitors.yaml \
  monitoring.coreos.com_prometheusrules.yaml

echo "$tools"
