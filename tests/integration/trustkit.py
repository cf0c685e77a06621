"""Helpers of the tests that judge bindings: nodes with GPUs, map pods, Events, metrics, status."""

from __future__ import annotations

import re
import subprocess
import sys
import urllib.request
from typing import Any

from gpuplace_dev.localcluster import FakeNode, LocalCluster
from placement.annotations import MAP_LABEL
from tests.integration.controllerkit import (
    ControllerProcess,
    admitted,
    get_pod,
    gpuplace_status,
    inventory_for,
    publish_inventory,
    unique,
)


def node_with_gpus(cluster: LocalCluster, gpus: int = 4) -> str:
    name = unique("trust")
    cluster.create_nodes([FakeNode(name, gpus=gpus)])
    publish_inventory(cluster, inventory_for(name, gpus))
    return name


def map_pod(name: str, map_name: str, **extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {MAP_LABEL: map_name}},
        "spec": {"schedulerName": "gpuplace", "containers": [admitted("main", "busybox")]},
        **extra,
    }


def bound(cluster: LocalCluster, namespace: str, name: str) -> dict[str, Any] | None:
    pod = get_pod(cluster, namespace, name)
    return pod if pod and pod["spec"].get("nodeName") else None


def events(cluster: LocalCluster, namespace: str, name: str) -> list[dict[str, Any]]:
    status, body = cluster.request(
        "GET",
        f"/api/v1/namespaces/{namespace}/events?fieldSelector=involvedObject.name%3D{name}",
    )
    assert status == 200, body
    return list(body["items"])


def status_row(cluster: LocalCluster, namespace: str, pod: str) -> str:
    """The line of `gpuplace status` that shows pod `namespace/pod` (the table lists the pods of
    every namespace, sorted by namespace: other tests' pods may have the same name)."""
    shown = gpuplace_status(cluster)
    return next(line for line in shown.splitlines() if line.split()[:2] == [namespace, pod])


def metric(proc: ControllerProcess, name: str) -> float:
    port = re.search(r"metrics on port (\d+)", proc.log())
    assert port, proc.log()[-2000:]
    with urllib.request.urlopen(f"http://127.0.0.1:{port.group(1)}/metrics", timeout=5) as r:
        text = r.read().decode()
    found = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def gpuplace_key(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    """`gpuplace key ARGS` as the cluster's administrator."""
    return subprocess.run(
        [sys.executable, "-m", "gpuplace", "key", f"--kubeconfig={cluster.kubeconfig}", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
