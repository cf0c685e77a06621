#!/usr/bin/env bash
# Fills .device-carry/c1 and c2 (each under 64 MiB with the working tree) for running the
# benchmarks on a larger machine without network, Go or the cache (README.md beside this file).
set -euo pipefail
root=$(git rev-parse --show-toplevel); cd "$root"
here=$(cd "$(dirname "$0")" && pwd)
grep -qx '/.device-carry/' .git/info/exclude 2>/dev/null || echo '/.device-carry/' >> .git/info/exclude
make -s control-plane tools >/dev/null
py=.venv/bin/python
bin=$(PYTHONPATH=dev $py -c 'from gpuplace_dev.localcluster.binaries import cache_bin_dir; print(cache_bin_dir())')
helm=$(PYTHONPATH=dev $py -c 'from gpuplace_dev.localcluster.tools import helm_binary; print(helm_binary())')
ref=$(PYTHONPATH=.:dev $py -c 'from bench._refwebhook import binary; print(binary())')
rm -rf .device-carry && mkdir -p .device-carry/c1 .device-carry/c2/whl
# *.xz go to /tmp/kb (the control plane, found through KUBEBUILDER_ASSETS); *.gpc into the cache
for b in kube-apiserver kube-controller-manager etcd; do xz -T0 -6 -c "$bin/$b" > ".device-carry/c1/$b.xz"; done
xz -T0 -6 -c "$helm" > .device-carry/c1/helm.gpc
for b in kube-scheduler kwok; do xz -T0 -6 -c "$bin/$b" > ".device-carry/c2/$b.xz"; done
xz -T0 -6 -c "$ref" > ".device-carry/c2/$(basename "$ref").gpc"
cp "$here/unpack.sh" .device-carry/c1/; cp "$here/bench.sh" .device-carry/c2/
$py - > .device-carry/c2/requirements.txt <<'PY'
import tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
dev = [r for r in project["optional-dependencies"]["dev"] if r.startswith(("grpcio", "opentelemetry-proto", "granian", "gunicorn"))]
print("\n".join(project["dependencies"] + dev))
PY
# The other machine runs Python 3.12.
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform any -d .device-carry/c2/whl -r .device-carry/c2/requirements.txt
# What the other machine's Python already has stays behind (a call carries at most 64 MiB).
for p in grpcio protobuf pyyaml PyYAML nvidia_ml_py prometheus_client requests urllib3 certifi \
         charset_normalizer idna six python_dateutil werkzeug jinja2 markupsafe MarkupSafe click \
         aiohttp multidict propcache yarl frozenlist aiosignal attrs aiohappyeyeballs; do
  rm -f .device-carry/c2/whl/"$p"-*.whl
done
du -sh .device-carry/c1 .device-carry/c2
