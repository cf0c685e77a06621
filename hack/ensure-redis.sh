#!/usr/bin/env bash
# ArgoCD caches in Redis; LocalArgoCD starts a loopback redis-server of its own. Installs Debian's
# redis-server with apt-get (as root) when none is on PATH, so that `make demo` needs no manual step.
set -euo pipefail
log_prefix=redis
# shellcheck source=hack/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

command -v redis-server >/dev/null && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  log "installing redis-server with apt-get (ArgoCD's cache)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null 2>&1 ||
    { apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; } ||
    die "apt-get install redis-server failed"
  # The package's own service is not needed: LocalArgoCD runs one on a loopback port.
  command -v systemctl >/dev/null && systemctl disable --now redis-server >/dev/null 2>&1 || true
  exit 0
fi
die "redis-server not found on PATH; install it (Debian/Ubuntu: apt-get install redis-server, macOS: brew install redis), or run make demo-quick / gpuplace demo --no-argocd"
