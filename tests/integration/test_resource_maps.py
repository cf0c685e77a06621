"""PlacementMap and PlacementPolicy custom resources against the real apiserver: the controller
serves them beside the ConfigMap form, writes their status in Kubernetes conventions, and a map
moves from one form to the other under bound pods without a rebind or a drift."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from gpuplace_dev.localcluster import LocalCluster
from kubeio.paths import PLACEMENT_MAPS, PLACEMENT_POLICIES
from placement.annotations import DRIFTED_CONDITION
from tests.integration.controllerkit import (
    apply_map,
    create_workload,
    fresh_namespace,
    gpu_nodes,
    gpu_uuid,
    map_status,
    map_yaml,
    running_controller,
    statefulset,
    unique,
    wait_for,
    wait_for_bound,
    wait_for_map,
)

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("system_namespaces")]


def resource_of(text: str) -> dict[str, Any]:
    return dict(yaml.safe_load(text))


def apply_resource(cluster: LocalCluster, text: str) -> dict[str, Any]:
    """Creates the PlacementMap, or replaces its spec (a merge patch, as kubectl apply would)."""
    body = resource_of(text)
    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    status, resp = cluster.request("POST", PLACEMENT_MAPS.collection(namespace), body)
    if status == 409:
        status, resp = cluster.request(
            "PATCH", PLACEMENT_MAPS.item(name, namespace), {"spec": body["spec"]}
        )
    assert status in (200, 201), resp
    return dict(resp)


def get_resource(cluster: LocalCluster, namespace: str, name: str) -> dict[str, Any] | None:
    status, body = cluster.request("GET", PLACEMENT_MAPS.item(name, namespace))
    return dict(body) if status == 200 else None


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    for cond in (obj.get("status") or {}).get("conditions") or ():
        if cond["type"] == kind:
            return dict(cond)
    return {}


def wait_for_resource(
    cluster: LocalCluster, namespace: str, name: str, phase: str, timeout: float = 60.0
) -> dict[str, Any]:
    """Waits until the resource's status reports `phase` for its current generation."""

    def current() -> dict[str, Any] | None:
        obj = get_resource(cluster, namespace, name)
        if obj is None:
            return None
        status = obj.get("status") or {}
        fresh = status.get("observedGeneration") == obj["metadata"]["generation"]
        return obj if fresh and status.get("phase") == phase else None

    return dict(wait_for(f"placementmap {namespace}/{name} {phase}", current, timeout=timeout))


def pods_held(cluster: LocalCluster, namespace: str, count: int) -> dict[str, tuple[str, str]]:
    """Each bound pod's uid and node."""
    pods = wait_for_bound(cluster, namespace, count)
    return {n: (p["metadata"]["uid"], p["spec"]["nodeName"]) for n, p in pods.items()}


@pytest.fixture
def nodes(cluster: LocalCluster) -> list[str]:
    return gpu_nodes(cluster, unique("pm"), 2)


def test_a_placementmap_resource_places_pods_and_reports_conditions(
    cluster: LocalCluster, nodes: list[str]
) -> None:
    with fresh_namespace(cluster, "pm") as ns, running_controller(cluster):
        text = map_yaml(ns, "llm", [(0, nodes[0], [0, 1]), (1, nodes[1], [2])])
        apply_resource(cluster, text)
        obj = wait_for_resource(cluster, ns, "llm", "Valid")
        status = obj["status"]
        assert status["slots"]["total"] == 2 and status["slots"]["served"] == 2
        assert condition(obj, "Valid")["status"] == "True"
        assert condition(obj, "Ready")["status"] == "True"
        assert condition(obj, "Degraded")["status"] == "False"
        assert condition(obj, "Ready")["observedGeneration"] == obj["metadata"]["generation"]

        create_workload(cluster, statefulset(ns, "llm", "llm", 2))
        pods = wait_for_bound(cluster, ns, 2)
        devices = {n: p["metadata"]["annotations"]["gpuplace.io/devices"] for n, p in pods.items()}
        assert devices == {
            "llm-0": f"{gpu_uuid(nodes[0], 0)},{gpu_uuid(nodes[0], 1)}",
            "llm-1": gpu_uuid(nodes[1], 2),
        }
        wait_for(
            "the bound count on the resource",
            lambda: (o := get_resource(cluster, ns, "llm")) and o["status"]["slots"]["bound"] == 2,
        )
        table = cluster.kubectl("get", "pm", "-n", ns).stdout
        header, row = table.splitlines()[:2]
        assert header.split() == ["NAME", "PHASE", "SLOTS", "BOUND", "DRIFTED", "AGE"]
        assert row.split()[:5] == ["llm", "Valid", "2", "2", "0"]

        # Slot 1 moves to GPU 3 (its pod drifts); a new slot 2 names a GPU the inventory lacks.
        moved = [(0, nodes[0], [0, 1]), (1, nodes[1], [3]), (2, nodes[1], [7])]
        apply_resource(cluster, map_yaml(ns, "llm", moved))
        obj = wait_for_resource(cluster, ns, "llm", "Degraded")
        degraded = condition(obj, "Degraded")
        assert degraded["status"] == "True" and nodes[1] in degraded["message"]
        assert condition(obj, "Ready")["status"] == "False"
        obj = wait_for(
            "the drift on the resource",
            lambda: (
                (o := get_resource(cluster, ns, "llm"))
                and o["status"]["slots"]["drifted"] == 1
                and o
            ),
        )
        assert condition(obj, "Drifted")["status"] == "True"
        assert "manual" in condition(obj, "Drifted")["message"]
        described = cluster.kubectl("describe", "pm", "-n", ns, "llm").stdout
        assert "Degraded" in described and "Drifted" in described


def test_a_map_moves_from_its_configmap_to_its_resource_without_a_rebind(
    cluster: LocalCluster, nodes: list[str]
) -> None:
    with fresh_namespace(cluster, "pm-move") as ns, running_controller(cluster):
        text = map_yaml(ns, "llm", [(0, nodes[0], [0]), (1, nodes[1], [1])])
        apply_map(cluster, ns, "llm", text)
        wait_for_map(cluster, ns, "llm", "Valid")
        create_workload(cluster, statefulset(ns, "llm", "llm", 2))
        before = pods_held(cluster, ns, 2)

        # The middle state: both forms, the same content. One map, the resource serves it.
        apply_resource(cluster, text)
        obj = wait_for_resource(cluster, ns, "llm", "Valid")
        assert obj["status"]["supersedes"] == f"configmap {ns}/llm"
        wait_for_map(cluster, ns, "llm", "Valid", containing="superseded by PlacementMap")
        wait_for(
            "both bound pods counted on the resource",
            lambda: (o := get_resource(cluster, ns, "llm")) and o["status"]["slots"]["bound"] == 2,
        )

        # The ConfigMap goes: nothing moves, nothing drifts.
        status, body = cluster.request("DELETE", f"/api/v1/namespaces/{ns}/configmaps/llm")
        assert status == 200, body
        obj = wait_for(
            "the resource alone",
            lambda: (
                (o := get_resource(cluster, ns, "llm"))
                and o["status"].get("supersedes") == ""
                and o
            ),
        )
        assert obj["status"]["phase"] == "Valid" and obj["status"]["slots"]["drifted"] == 0
        after = pods_held(cluster, ns, 2)
        assert after == before
        for pod in wait_for_bound(cluster, ns, 2).values():
            kinds = {c["type"] for c in pod["status"].get("conditions") or ()}
            assert DRIFTED_CONDITION not in kinds


def test_two_forms_that_differ_are_a_conflict_and_nothing_new_is_served(
    cluster: LocalCluster, nodes: list[str]
) -> None:
    with fresh_namespace(cluster, "pm-conflict") as ns, running_controller(cluster):
        apply_map(cluster, ns, "llm", map_yaml(ns, "llm", [(0, nodes[0], [0])]))
        wait_for_map(cluster, ns, "llm", "Valid")
        apply_resource(cluster, map_yaml(ns, "llm", [(0, nodes[0], [3])]))
        obj = wait_for_resource(cluster, ns, "llm", "Conflict")
        assert condition(obj, "Valid")["status"] == "False"
        assert "declares this map with other content" in obj["status"]["message"]
        wait_for_map(cluster, ns, "llm", "Conflict", containing="other content")
        create_workload(cluster, statefulset(ns, "llm", "llm", 1))
        (pod,) = wait_for_bound(cluster, ns, 1).values()
        # What was served before the resource came keeps serving: GPU 0, not 3.
        assert pod["metadata"]["annotations"]["gpuplace.io/devices"] == gpu_uuid(nodes[0], 0)
        status, body = cluster.request("DELETE", PLACEMENT_MAPS.item("llm", ns))
        assert status == 200, body
        wait_for(
            "the ConfigMap alone, Valid",
            lambda: (
                (s := map_status(cluster, ns, "llm"))
                and s["phase"] == "Valid"
                and "superseded" not in s["message"]
            ),
        )


POLICY = """\
apiVersion: gpuplace.io/v1alpha1
kind: PlacementPolicy
metadata:
  name: gpuplace-policy
spec:
  grants:
    - namespaces: [{namespace}]
      nodes: [{node}]
"""


@pytest.fixture
def policy_resource(cluster: LocalCluster) -> Iterator[None]:
    yield
    cluster.request("DELETE", PLACEMENT_POLICIES.item("gpuplace-policy"))


@pytest.mark.usefixtures("policy_resource")
def test_the_policy_resource_grants_and_refuses(cluster: LocalCluster, nodes: list[str]) -> None:
    with fresh_namespace(cluster, "pm-grant") as ns, running_controller(cluster):
        body = yaml.safe_load(POLICY.format(namespace=ns, node=nodes[0]))
        status, resp = cluster.request("POST", PLACEMENT_POLICIES.collection(), body)
        assert status == 201, resp
        wait_for(
            "the policy's status",
            lambda: (
                (o := cluster.request("GET", PLACEMENT_POLICIES.item("gpuplace-policy"))[1])
                and (o.get("status") or {}).get("phase") == "Valid"
            ),
        )
        apply_resource(cluster, map_yaml(ns, "ok", [(0, nodes[0], [0])]))
        wait_for_resource(cluster, ns, "ok", "Valid")
        apply_resource(cluster, map_yaml(ns, "outside", [(0, nodes[1], [0])]))
        obj = wait_for_resource(cluster, ns, "outside", "Invalid")
        assert nodes[1] in json.dumps(obj["status"]["errors"])
