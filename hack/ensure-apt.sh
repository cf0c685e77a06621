#!/usr/bin/env bash
# ensure-apt.sh COMMAND[:PACKAGE]... -> each COMMAND is on PATH, installing its Debian PACKAGE
# (default: the command's name) with apt-get as root when it is missing, so that `make` targets need
# no manual step: iptables for the real node's pod network, mmdebstrap and buildah for the image.
set -euo pipefail
log_prefix=apt
# shellcheck source=hack/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

missing=()
for spec in "$@"; do
  command=${spec%%:*}
  package=${spec#*:}
  command -v "$command" >/dev/null || PATH=$PATH:/usr/sbin:/sbin command -v "$command" >/dev/null ||
    missing+=("$package")
done
[ ${#missing[@]} -eq 0 ] && exit 0
[ "$(id -u)" = 0 ] && command -v apt-get >/dev/null ||
  die "${missing[*]} not found; install them (Debian/Ubuntu: apt-get install ${missing[*]})"
log "installing ${missing[*]} with apt-get"
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null 2>&1 ||
  { apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null; } ||
  die "apt-get install ${missing[*]} failed"
