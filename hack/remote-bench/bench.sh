#!/usr/bin/env bash
# Second half, right after unpack.sh: the rest of the binaries, the wheels, then the command given
# (from the repository root); its output also goes to $BENCH_OUT (default bench-out.txt there).
set -u -o pipefail  # the command's status, not tee's, is the call's
here=$(cd "$(dirname "$0")" && pwd); root=$(cd "$here/../.." && pwd)
[ -x /tmp/kb/kube-apiserver ] || { echo "run unpack.sh first, just before this"; exit 3; }
[ -x /tmp/gpcache/tools/bin/helm ] || { echo "helm missing: run unpack.sh first"; exit 3; }
for f in "$here"/*.xz; do xz -dc "$f" > "/tmp/kb/$(basename "$f" .xz)"; done; chmod +x /tmp/kb/*
mkdir -p /tmp/gpcache/bench
for f in "$here"/*.gpc; do xz -dc "$f" > "/tmp/gpcache/bench/$(basename "$f" .gpc)"; done
chmod +x /tmp/gpcache/bench/*
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site "$here"/whl/*.whl || exit 3
export PYTHONPATH="$root:$root/dev:/tmp/site" PYTHONUNBUFFERED=1 KUBEBUILDER_ASSETS=/tmp/kb \
  TEST_ASSET_KUBECTL=/bin/true GPUPLACE_CACHE=/tmp/gpcache
cd "$root"
echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB, $(grep -m1 'model name' /proc/cpuinfo)"
"$@" 2>&1 | tee "${BENCH_OUT:-bench-out.txt}"
