"""`gpuplace cluster up --real-node --chart` as a user runs it: gpuplace's pods Running on
`localhost` from the image built here; a map and a pod applied with kubectl end with the pod bound
by the in-cluster controller and its container printing the declared GPUs; `cluster down` leaves no
rule, address or bridge behind."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from gpuplace_dev.localcluster import chart, find_binaries, network
from gpuplace_dev.localcluster.realnode import BRIDGE
from tests.integration.controllerkit import map_yaml, placement_configmap


def test_cluster_up_chart_runs_gpuplace_as_pods_and_down_removes_its_network(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "cluster"
    gpuplace = [sys.executable, "-m", "gpuplace", "cluster"]
    kubectl = [str(find_binaries(build=False).kubectl), f"--kubeconfig={directory / 'kubeconfig'}"]

    def k(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*kubectl, *args], input=stdin, capture_output=True, text=True, check=False, timeout=60
        )

    up = subprocess.run(
        [*gpuplace, "up", "--dir", str(directory), "--nodes", "1", "--real-node", "--chart"],
        capture_output=True, text=True, check=False, timeout=900,
    )  # fmt: skip
    assert up.returncode == 0, up.stderr
    try:
        assert "running gpuplace's chart" in up.stderr
        pods = json.loads(k("-n", "gpuplace-system", "get", "pods", "-o", "json").stdout)["items"]
        running = sorted(
            p["metadata"]["labels"]["app.kubernetes.io/component"]
            for p in pods
            if p["status"]["phase"] == "Running" and p["spec"]["nodeName"] == "localhost"
        )
        assert running == ["agent", "controller", "controller", "webhook", "webhook"]
        images = {p["spec"]["containers"][0]["image"] for p in pods}
        assert images == {"gpuplace.local/gpuplace:0.1.0"}

        assert k("create", "namespace", "team").returncode == 0
        text = map_yaml("team", "llm", [(0, "localhost", [1])])
        applied = k("apply", "-f", "-", stdin=json.dumps(placement_configmap("team", "llm", text)))
        assert applied.returncode == 0, applied.stderr
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "llm-0",
                "namespace": "team",
                "labels": {"gpuplace.io/map": "llm"},
            },
            "spec": {"containers": [{"name": "probe", "image": "gpuplace.local/gpu-probe:dev"}]},
        }
        deadline = time.monotonic() + 60
        while k("apply", "-f", "-", stdin=json.dumps(pod)).returncode != 0:
            assert time.monotonic() < deadline, "the webhook never admitted the pod"
            time.sleep(1)
        bound: dict[str, Any] = {}
        deadline = time.monotonic() + 120
        while "environment at start" not in (log := k("-n", "team", "logs", "llm-0").stdout):
            assert time.monotonic() < deadline, k(
                "-n", "team", "get", "pod", "llm-0", "-o", "yaml"
            ).stdout
            time.sleep(1)
        bound = json.loads(k("-n", "team", "get", "pod", "llm-0", "-o", "json").stdout)
        assert bound["spec"]["nodeName"] == "localhost"
        assert "CUDA_VISIBLE_DEVICES=1\n" in log
        assert bound["metadata"]["annotations"]["gpuplace.io/devices"] == chart.real_node_uuid(1)
    finally:
        down = subprocess.run(
            [*gpuplace, "down", "--dir", str(directory)],
            capture_output=True, text=True, check=False, timeout=300,
        )  # fmt: skip
    assert down.returncode == 0, down.stderr
    assert network.leftovers() == []
    assert not Path(f"/sys/class/net/{BRIDGE}").exists()
