"""MIG slots through the controller and binder on the real apiserver: a map entry `mig: {gpu,
profile}` resolves against the node's inventory ConfigMap (its `migInstances`), and the pod is
bound with the instance's MIG UUID as its devices and CUDA_VISIBLE_DEVICES in both envModes."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace

import pytest

from gpuplace_dev.localcluster import LocalCluster
from placement.annotations import CUDA_ANNOTATION, DEVICES_ANNOTATION
from placement.inventory import MigInstance, NodeInventory
from tests.integration.controllerkit import (
    ControllerProcess,
    apply_map,
    create_workload,
    fresh_namespace,
    gpu_nodes,
    gpuplace_status,
    inventory_for,
    map_status,
    publish_inventory,
    running_controller,
    statefulset,
    unique,
    wait_for,
    wait_for_bound,
)

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("system_namespaces")]


@pytest.fixture
def namespace(cluster: LocalCluster) -> Iterator[str]:
    with fresh_namespace(cluster, "mig") as name:
        yield name


@pytest.fixture
def controller(cluster: LocalCluster) -> Iterator[ControllerProcess]:
    with running_controller(cluster) as proc:
        yield proc


def mig_uuid(gpu: int, start: int) -> str:
    return f"MIG-7e1d0c3e-{gpu:04x}-4c2e-9f61-{start:012x}"


def with_mig(node: str) -> NodeInventory:
    """GPU 0 in MIG mode with two 3g.40gb instances (placement starts 4 and 0); GPU 1 whole."""
    inventory = inventory_for(node, 2)
    gpu0 = replace(
        inventory.devices[0],
        mig_mode=True,
        mig_instances=(
            MigInstance(mig_uuid(0, 4), "3g.40gb", 1, 4, 4, 40192),
            MigInstance(mig_uuid(0, 0), "3g.40gb", 2, 0, 4, 40192),
        ),
    )
    return replace(inventory, devices=(gpu0, inventory.devices[1]))


def mig_map(namespace: str, node: str, env_mode: str) -> str:
    return f"""\
apiVersion: gpuplace.io/v1alpha1
kind: PlacementMap
metadata:
  name: llm
  namespace: {namespace}
spec:
  envMode: {env_mode}
  placements:
    - index: 0
      node: {node}
      mig: {{gpu: 0, profile: 3g.40gb}}
    - index: 1
      node: {node}
      mig: {{gpu: 0, profile: 3g.40gb}}
    - index: 2
      node: {node}
      devices: [1]
"""


@pytest.mark.parametrize("env_mode", ["index", "uuid"])
def test_pods_of_mig_slots_are_bound_to_their_instance_uuids(
    cluster: LocalCluster, namespace: str, controller: ControllerProcess, env_mode: str
) -> None:
    node = gpu_nodes(cluster, unique("mig"), 1, gpus=2, inventories=False)[0]
    publish_inventory(cluster, with_mig(node))
    apply_map(cluster, namespace, "llm", mig_map(namespace, node, env_mode))
    create_workload(cluster, statefulset(namespace, "web", "llm", 3))
    pods = wait_for_bound(cluster, namespace, 3, "3 bound pods")
    for name, uuid in (("web-0", mig_uuid(0, 0)), ("web-1", mig_uuid(0, 4))):
        ann = pods[name]["metadata"]["annotations"]
        assert pods[name]["spec"]["nodeName"] == node
        assert (ann[DEVICES_ANNOTATION], ann[CUDA_ANNOTATION]) == (uuid, uuid)
    whole = pods["web-2"]["metadata"]["annotations"][CUDA_ANNOTATION]
    assert whole == ("1" if env_mode == "index" else with_mig(node).devices[1].uuid)
    status = wait_for(
        "status with 3 bound",
        lambda: (s := map_status(cluster, namespace, "llm")) and s["slots"]["bound"] == 3 and s,
    )
    assert status["phase"] == "Valid"
    explained = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpuplace",
            "explain",
            f"{namespace}/web-1",
            f"--kubeconfig={cluster.kubeconfig}",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    assert f"GPUs: gpu 0 / 3g.40gb ({mig_uuid(0, 4)})" in explained
    assert f"gpu 0 / 3g.40gb ({mig_uuid(0, 0)})" in gpuplace_status(cluster)


def test_a_map_giving_a_mig_gpu_whole_to_another_map_conflicts(
    cluster: LocalCluster, namespace: str, controller: ControllerProcess
) -> None:
    node = gpu_nodes(cluster, unique("migc"), 1, gpus=2, inventories=False)[0]
    publish_inventory(cluster, with_mig(node))
    apply_map(cluster, namespace, "llm", mig_map(namespace, node, "uuid"))
    wait_for(
        "llm valid",
        lambda: (s := map_status(cluster, namespace, "llm")) and s["phase"] == "Valid",
    )
    whole = f"""\
apiVersion: gpuplace.io/v1alpha1
kind: PlacementMap
metadata:
  name: whole
  namespace: {namespace}
spec:
  placements:
    - index: 0
      node: {node}
      devices: [0]
"""
    apply_map(cluster, namespace, "whole", whole)
    status = wait_for(
        "whole in conflict",
        lambda: (s := map_status(cluster, namespace, "whole")) and s["phase"] == "Conflict" and s,
    )
    assert f"{namespace}/llm" in str(status)
