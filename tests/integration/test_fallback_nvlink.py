"""Spare devices and NVLink-aware picks through the controller and binder on the real apiserver:
a fallback GPU serves a slot whose declared GPU went missing from the node's inventory ConfigMap
(the map status and `gpuplace status` say so), and a `count` entry takes the NVLink-joined pair
that the inventory's `nvlinkPeers` report; a `sameClique` map follows its nodes' clique labels."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest

from gpuplace_dev.localcluster import LocalCluster
from placement.annotations import CUDA_ANNOTATION, DEVICES_ANNOTATION
from placement.types import GpuUuid
from tests.integration.controllerkit import (
    ControllerProcess,
    apply_map,
    create_workload,
    fresh_namespace,
    gpu_nodes,
    gpu_uuid,
    gpuplace_status,
    inventory_for,
    map_status,
    publish_inventory,
    running_controller,
    statefulset,
    unique,
    wait_for,
    wait_for_bound,
    wait_for_map,
)

CLIQUE = "nvidia.com/gpu.clique"

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("system_namespaces")]


@pytest.fixture
def namespace(cluster: LocalCluster) -> Iterator[str]:
    with fresh_namespace(cluster, "spare") as name:
        yield name


@pytest.fixture
def controller(cluster: LocalCluster) -> Iterator[ControllerProcess]:
    with running_controller(cluster) as proc:
        yield proc


def one_slot_map(namespace: str, entry: str) -> str:
    return f"""\
apiVersion: gpuplace.io/v1alpha1
kind: PlacementMap
metadata:
  name: llm
  namespace: {namespace}
spec:
  placements:
    - {entry}
"""


def test_a_fallback_device_serves_while_the_declared_one_is_missing(
    cluster: LocalCluster, namespace: str, controller: ControllerProcess
) -> None:
    node = gpu_nodes(cluster, unique("fb"), 1, gpus=4, inventories=False)[0]
    full = inventory_for(node, 4)
    # GPU 1 is gone from what the agent reports (fallen off the bus).
    publish_inventory(
        cluster, replace(full, devices=tuple(d for d in full.devices if d.index != 1))
    )
    text = one_slot_map(namespace, f"{{index: 0, node: {node}, devices: [1], fallback: [3, 2]}}")
    apply_map(cluster, namespace, "llm", text)
    status = wait_for_map(cluster, namespace, "llm", "Degraded", "serving from fallback")
    assert status["slots"]["blocked"] == 0
    assert (
        f"device 1 not found: fallback device 3 ({gpu_uuid(node, 3)}) stands in"
        in (status["message"])
    )
    create_workload(cluster, statefulset(namespace, "web", "llm", 1))
    pod = wait_for_bound(cluster, namespace, 1)["web-0"]
    ann = pod["metadata"]["annotations"]
    assert (ann[DEVICES_ANNOTATION], ann[CUDA_ANNOTATION]) == (gpu_uuid(node, 3), "3")
    assert "serving from fallback" in gpuplace_status(cluster)
    # The declared GPU is back: the slot returns to it and the pod on the spare has drifted.
    publish_inventory(cluster, full)
    status = wait_for(
        "the slot back on GPU 1 and its pod drifted",
        lambda: (
            (s := map_status(cluster, namespace, "llm"))
            and s["phase"] == "Valid"
            and s["slots"]["drifted"] == 1
            and s
        ),
    )
    assert "serving from fallback" not in status["message"]


def test_count_takes_the_pair_joined_by_nvlink(
    cluster: LocalCluster, namespace: str, controller: ControllerProcess
) -> None:
    node = gpu_nodes(cluster, unique("nvl"), 1, gpus=4, inventories=False)[0]
    inventory = inventory_for(node, 4)
    pair = {1: GpuUuid(gpu_uuid(node, 3)), 3: GpuUuid(gpu_uuid(node, 1))}
    devices = tuple(
        replace(d, nvlink_peers=(pair[d.index],)) if d.index in pair else d
        for d in inventory.devices
    )
    publish_inventory(cluster, replace(inventory, devices=devices))
    text = one_slot_map(
        namespace, f"{{index: 0, node: {node}, count: 2, require: {{nvlink: true}}}}"
    )
    apply_map(cluster, namespace, "llm", text)
    wait_for_map(cluster, namespace, "llm", "Valid")
    create_workload(cluster, statefulset(namespace, "web", "llm", 1))
    ann = wait_for_bound(cluster, namespace, 1)["web-0"]["metadata"]["annotations"]
    assert set(ann[DEVICES_ANNOTATION].split(",")) == {gpu_uuid(node, 1), gpu_uuid(node, 3)}
    assert sorted(ann[CUDA_ANNOTATION].split(",")) == ["1", "3"]


def test_same_clique_follows_the_nodes_clique_labels(
    cluster: LocalCluster, namespace: str, controller: ControllerProcess
) -> None:
    prefix = unique("clq")
    first = gpu_nodes(cluster, f"{prefix}a", 1, gpus=2, labels={CLIQUE: "c.1"})[0]
    second = gpu_nodes(cluster, f"{prefix}b", 1, gpus=2, labels={CLIQUE: "c.2"})[0]
    text = f"""\
apiVersion: gpuplace.io/v1alpha1
kind: PlacementMap
metadata:
  name: llm
  namespace: {namespace}
spec:
  sameClique: true
  placements:
    - {{index: 0, node: {first}, count: 1}}
    - {{index: 1, node: {second}, count: 1}}
"""
    apply_map(cluster, namespace, "llm", text)
    status = wait_for_map(cluster, namespace, "llm", "Degraded", "sameClique")
    assert status["slots"]["blocked"] == 1
    assert (
        f"node {second} is in GPU clique 'c.2', the map's other slots in 'c.1'"
        in (status["message"])
    )
    # Relabelling the node (nothing else about it changes) recompiles the map.
    code, body = cluster.request(
        "PATCH", f"/api/v1/nodes/{second}", {"metadata": {"labels": {CLIQUE: "c.1"}}}
    )
    assert code == 200, body
    status = wait_for_map(cluster, namespace, "llm", "Valid")
    assert status["slots"]["blocked"] == 0
