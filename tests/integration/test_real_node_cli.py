"""`gpuplace cluster up --real-node` / `down`: a detached real node that runs pods, keeps the
machine's real-node lock while up, and leaves no process, mount or system path behind."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from gpuplace_dev.localcluster import (
    GPU_PROBE_IMAGE,
    REAL_NODE_LOCK,
    REAL_NODE_NAME,
    RealNodeError,
    find_binaries,
)
from gpuplace_dev.localcluster.realnode import SYSTEM_PATHS, NodeLock
from tests.integration import shellkit

pytestmark = pytest.mark.real_node


def processes_named(name: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == name:
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@pytest.mark.slow
def test_cluster_up_real_node_runs_pods_and_down_removes_everything(tmp_path: Path) -> None:
    directory = tmp_path / "cluster"
    existed = {path: path.exists() for path in SYSTEM_PATHS}
    kubectl = [str(find_binaries(build=False).kubectl), f"--kubeconfig={directory / 'kubeconfig'}"]

    with shellkit.cluster_up(
        directory, "--nodes", "1", "--real-node", "--real-node-label", "gpu-node-name=node9",
        up_timeout=600, down_timeout=180,
    ) as (up, state):  # fmt: skip
        node_directory = (directory / "node").resolve()
        assert "and real node localhost" in up.stderr
        assert [p.name for p in state.processes if p.alive()] == [
            "etcd",
            "kube-apiserver",
            "kube-controller-manager",
            "kwok",
            "containerd",
            "kubelet",
        ]
        # The command has exited; containerd and the kubelet hold the lock now.
        with pytest.raises(RealNodeError):
            NodeLock(REAL_NODE_LOCK).acquire(0.5)
        node = json.loads(
            subprocess.run(
                [*kubectl, "get", "node", REAL_NODE_NAME, "-o", "json"],
                capture_output=True, text=True, check=True,
            ).stdout
        )  # fmt: skip
        assert node["metadata"]["labels"]["gpu-node-name"] == "node9"
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "probe", "namespace": "default"},
            "spec": {
                "nodeName": REAL_NODE_NAME,
                "containers": [
                    {
                        "name": "probe",
                        "image": GPU_PROBE_IMAGE,
                        "env": [{"name": "CUDA_VISIBLE_DEVICES", "value": "7"}],
                    }
                ],
            },
        }
        subprocess.run(
            [*kubectl, "apply", "-f", "-"], input=json.dumps(pod), text=True, check=True,
            capture_output=True,
        )  # fmt: skip
        subprocess.run(
            [*kubectl, "wait", "--for=condition=Ready", "pod/probe", "--timeout=120s"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        logs = subprocess.run(
            [*kubectl, "logs", "probe"], capture_output=True, text=True, check=True
        ).stdout
        assert "CUDA_VISIBLE_DEVICES=7" in logs.splitlines()
        assert processes_named("gpu-probe")
    # The containers and their shims are gone with the node, and so is everything it wrote
    # outside its directory.
    deadline = time.monotonic() + 10
    while processes_named("gpu-probe") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not processes_named("gpu-probe")
    assert not processes_named("containerd-shim")
    assert {path: path.exists() for path in SYSTEM_PATHS} == existed
    assert str(node_directory) not in Path("/proc/self/mountinfo").read_text()
    assert not node_directory.exists()
    assert not Path("/sys/class/net/gpuplace0").exists()
    lock = NodeLock(REAL_NODE_LOCK)
    lock.acquire(5.0)
    lock.release()
