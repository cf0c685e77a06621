"""Shell commands as the READMEs show them, run by bash with this checkout's `gpuplace`, the
pinned `kubectl` and `helm` on PATH and KUBECONFIG naming a local cluster."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from gpuplace_dev.localcluster import LocalCluster
from tests.chartkit import helm_binary

#: README.md, Install: what removes what `helm uninstall` keeps (run by test_chart_keyring.py on a
#: cluster of its own, after a real uninstall).
UNINSTALL = (
    "helm uninstall gpuplace -n gpuplace-system",
    "kubectl -n gpuplace-system delete secret gpuplace-binding-key",
    "kubectl delete validatingadmissionpolicybinding gpuplace-pod-bindings",
    "kubectl delete validatingadmissionpolicy gpuplace-pod-bindings",
    "kubectl delete namespace gpuplace-inventory",
)


def shell_env(cluster: LocalCluster) -> dict[str, str]:
    bins = [Path(sys.executable).parent, cluster.binaries.kubectl.parent, helm_binary().parent]
    home = helm_binary().parent.parent / "helm-home"
    return {
        **os.environ,
        "PATH": os.pathsep.join([*map(str, bins), os.environ.get("PATH", "/usr/bin:/bin")]),
        "KUBECONFIG": str(cluster.kubeconfig),
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
    }


def sh(command: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        ["bash", "-o", "pipefail", "-c", command],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert result.returncode == 0, f"{command!r} in {cwd}:\n{result.stdout}\n{result.stderr}"
    return result
