"""Shell commands as the READMEs show them, run by bash with this checkout's `gpuplace`, the
pinned `kubectl` and `helm` on PATH and KUBECONFIG naming a local cluster."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gpuplace_dev.localcluster import ClusterState, LocalCluster
from tests.chartkit import helm_binary

#: docs/install.md: what removes what `helm uninstall` keeps (run by test_chart_keyring.py on a
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


@contextmanager
def cluster_up(
    directory: Path, *options: str, up_timeout: float, down_timeout: float
) -> Iterator[tuple[subprocess.CompletedProcess[str], ClusterState]]:
    """`gpuplace cluster up --dir DIRECTORY OPTIONS` for the block, yielding its result and the
    state it wrote; then `gpuplace cluster down`, which must leave no process and no directory
    behind (whatever failed, the processes are killed)."""
    gpuplace = [sys.executable, "-m", "gpuplace", "cluster"]
    up = subprocess.run(
        [*gpuplace, "up", "--dir", str(directory), *options],
        capture_output=True,
        text=True,
        check=False,
        timeout=up_timeout,
    )
    assert up.returncode == 0, up.stderr
    state = ClusterState.read(directory / "state.json")
    try:
        yield up, state
    finally:
        down = subprocess.run(
            [*gpuplace, "down", "--dir", str(directory)],
            capture_output=True,
            text=True,
            check=False,
            timeout=down_timeout,
        )
        if down.returncode != 0:  # never leave a cluster behind, whatever failed
            for process in state.processes:
                if process.alive():
                    os.killpg(process.pid, signal.SIGKILL)

    assert down.returncode == 0, down.stderr
    assert not [p.name for p in state.processes if p.alive()]
    assert not directory.exists()
