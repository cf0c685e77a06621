#!/usr/bin/env bash
# First half, on the other machine: the largest binaries into /tmp/kb, helm into the cache.
set -eu; cd "$(dirname "$0")"
mkdir -p /tmp/kb /tmp/gpcache/tools/bin
for f in *.xz; do xz -dc "$f" > "/tmp/kb/${f%.xz}"; done
xz -dc helm.gpc > /tmp/gpcache/tools/bin/helm
chmod +x /tmp/kb/* /tmp/gpcache/tools/bin/helm
nproc; ls -la /tmp/kb /tmp/gpcache/tools/bin
