"""Bindings nobody can forge or rewrite, tried as a hostile tenant (a ServiceAccount with only the
`edit` ClusterRole in its own namespace) against the real apiserver, its admission policy and the
controller process."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import pytest

from gpuplace_dev.localcluster import LocalCluster
from placement.annotations import (
    CUDA_ANNOTATION,
    DEVICES_ANNOTATION,
    INDEX_ANNOTATION,
    MAP_ANNOTATION,
    NODE_ANNOTATION,
    SIGNATURE_ANNOTATION,
)
from tests.integration.controllerkit import (
    apply_map,
    create,
    get_pod,
    gpu_uuid,
    inventory_for,
    map_status,
    map_yaml,
    pending_reason,
    publish_inventory,
    refused_binds,
    solo_controller,
    wait_for,
)
from tests.integration.tenantkit import Tenant
from tests.integration.trustkit import (
    bound,
    events,
    map_pod,
    metric,
    node_with_gpus,
    status_row,
)

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("system_namespaces")]


@pytest.fixture(name="node")
def fresh_node(cluster: LocalCluster) -> str:
    """A node of its own, with 4 fake GPUs and their inventory."""
    return node_with_gpus(cluster)


@pytest.fixture(name="tenant")
def tenant_account(cluster: LocalCluster, team_and_tenant: tuple[str, str]) -> Tenant:
    """The hostile tenant, in the second namespace of `team_and_tenant`."""
    return Tenant(cluster, team_and_tenant[1])


def forged_annotations(namespace: str, node: str, devices: list[int]) -> dict[str, str]:
    return {
        MAP_ANNOTATION: "owner",
        NODE_ANNOTATION: node,
        INDEX_ANNOTATION: "0",
        DEVICES_ANNOTATION: ",".join(gpu_uuid(node, d) for d in devices),
        CUDA_ANNOTATION: ",".join(map(str, devices)),
        "gpuplace.io/model-generation": "1",
    }


def test_forged_bindings_are_refused_or_hold_nothing(
    cluster: LocalCluster, team_and_tenant: tuple[str, str], tenant: Tenant, node: str
) -> None:
    team, tenant_ns = team_and_tenant
    # The tenant cannot bind pods itself: only the binder's Bindings write the annotations.
    assert tenant.can("create", "pods")
    assert not tenant.can("create", "pods", "binding")
    assert not tenant.can("patch", "pods", "status")

    # 1. Created with spec.nodeName, schedulerName and hand-written annotations: refused.
    forged = map_pod("squat-0", "owner")
    del forged["metadata"]["labels"]
    forged["metadata"]["annotations"] = forged_annotations(tenant_ns, node, [0, 1])
    forged["spec"]["nodeName"] = node
    result = tenant.create(forged)
    assert result.returncode != 0
    assert "gpuplace.io/devices" in result.stderr
    assert "written only by the gpuplace binder" in result.stderr, result.stderr

    # 2. Pre-bound without annotations (allowed: it holds nothing), annotated later: refused.
    del forged["metadata"]["annotations"]
    forged["metadata"]["name"] = "squat-1"
    assert tenant.create(forged).returncode == 0, "a plain pre-bound pod is not gpuplace's business"
    result = tenant.kubectl(
        "annotate", "pod", "squat-1", f"{DEVICES_ANNOTATION}={gpu_uuid(node, 0)}"
    )
    assert result.returncode != 0
    assert "may not be changed" in result.stderr, result.stderr
    assert "gpuplace.io/devices" in result.stderr

    # 3. A forged binding that got past admission (here through an identity allowed to bind, as
    #    on a cluster without the policy): its unsigned annotations hold nothing.
    with solo_controller(cluster, "trust") as proc:
        # Pods created before the binding key existed hold without a signature (upgrades): the
        # forged one is created once the leader has its key.
        wait_for("the controller leads", lambda: "leading:" in proc.log())
        pending = map_pod("squat-2", "owner")
        del pending["metadata"]["labels"]
        create(cluster, f"/api/v1/namespaces/{tenant_ns}/pods", pending)
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {
                "name": "squat-2",
                "annotations": forged_annotations(tenant_ns, node, [0, 1, 2]),
            },
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        create(cluster, f"/api/v1/namespaces/{tenant_ns}/pods/squat-2/binding", binding)
        wait_for(
            "the forged pod's BindingUnverified Event",
            lambda: any(
                e["reason"] == "BindingUnverified" for e in events(cluster, tenant_ns, "squat-2")
            ),
        )
        assert metric(proc, "gpuplace_unverified_bindings_total") >= 1
        # The owning team's pod gets the GPUs the forged pod claims.
        apply_map(
            cluster, team, "owner", map_yaml(team, "owner", [(0, node, [0, 1]), (1, node, [2])])
        )
        create(cluster, f"/api/v1/namespaces/{team}/pods", map_pod("own-0", "owner"))
        owner = wait_for("own-0 bound", lambda: bound(cluster, team, "own-0"))
        annotations = owner["metadata"]["annotations"]
        assert annotations[DEVICES_ANNOTATION] == f"{gpu_uuid(node, 0)},{gpu_uuid(node, 1)}"
        assert annotations[SIGNATURE_ANNOTATION].startswith("v2:")
    # After a restart the cache is rebuilt from signed pods only: GPU 2 is free for index 1.
    with solo_controller(cluster, "trust") as again:
        create(cluster, f"/api/v1/namespaces/{team}/pods", map_pod("own-1", "owner"))
        second = wait_for("own-1 bound", lambda: bound(cluster, team, "own-1"))
        assert second["metadata"]["annotations"][DEVICES_ANNOTATION] == gpu_uuid(node, 2)
        assert refused_binds(again, ("own-0", "own-1")) == []
    kept = bound(cluster, team, "own-0")
    assert kept is not None and kept["metadata"]["annotations"] == annotations


def test_tenant_cannot_rewrite_its_bound_pods_binding(
    cluster: LocalCluster, team_and_tenant: tuple[str, str], tenant: Tenant, node: str
) -> None:
    _team, tenant_ns = team_and_tenant
    with solo_controller(cluster, "trust"):
        text = map_yaml(tenant_ns, "mine", [(0, node, [3])])
        configmap = tenant.kubectl(
            "create", "configmap", "mine", f"--from-literal=placement.yaml={text}"
        )
        assert configmap.returncode == 0, configmap.stderr
        labelled = tenant.kubectl("label", "configmap", "mine", "gpuplace.io/placement-map=true")
        assert labelled.returncode == 0, labelled.stderr
        assert tenant.create(map_pod("mine-0", "mine")).returncode == 0
        pod = wait_for("mine-0 bound", lambda: bound(cluster, tenant_ns, "mine-0"), timeout=60)
    before = pod["metadata"]["annotations"]
    assert before[CUDA_ANNOTATION] == "3"
    for args in (
        ("annotate", "--overwrite", "pod", "mine-0", f"{CUDA_ANNOTATION}=0"),
        ("annotate", "--overwrite", "pod", "mine-0", f"{DEVICES_ANNOTATION}={gpu_uuid(node, 0)}"),
        ("annotate", "pod", "mine-0", f"{SIGNATURE_ANNOTATION}-"),
        ("annotate", "pod", "mine-0", "gpuplace.io/extra=1"),
    ):
        result = tenant.kubectl(*args)
        assert result.returncode != 0, args
        assert "may not be changed" in result.stderr, result.stderr
        assert "record the pod's GPU binding" in result.stderr
    # Other annotations stay the tenant's to change.
    assert tenant.kubectl("annotate", "pod", "mine-0", "team/owner=me").returncode == 0
    after = get_pod(cluster, tenant_ns, "mine-0")
    assert after is not None
    assert {
        k: v for k, v in after["metadata"]["annotations"].items() if k != "team/owner"
    } == before


def test_pods_bound_by_the_earlier_tools_keep_their_gpus(
    cluster: LocalCluster, team_and_tenant: tuple[str, str], node: str
) -> None:
    team, _ = team_and_tenant
    # Bound before gpuplace came (here: created bound, as a webhook-based scheduler does).
    old = map_pod("old-trainer-0", "unused", schedulerName="gpu-scheduler")
    old["metadata"] = {
        "name": "old-trainer-0",
        "annotations": {"gpu-scheduling-map": f"0={node}:0,1\n"},
    }
    old["spec"]["schedulerName"] = "gpu-scheduler"
    old["spec"]["nodeName"] = node
    create(cluster, f"/api/v1/namespaces/{team}/pods", old)
    apply_map(cluster, team, "new", map_yaml(team, "new", [(0, node, [1]), (1, node, [2])]))
    with solo_controller(cluster, "cutover") as proc:
        for name in ("new-0", "new-1"):
            create(cluster, f"/api/v1/namespaces/{team}/pods", map_pod(name, "new"))
        wait_for("new-1 bound", lambda: bound(cluster, team, "new-1"))
        wait_for("new-0 waits", lambda: pending_reason(cluster, team, "new-0") == "DeviceBusy")
        pod = get_pod(cluster, team, "new-0")
        assert pod is not None and not pod["spec"].get("nodeName")
        assert metric(proc, "gpuplace_prebound_legacy_pods_total") >= 1
        row = status_row(cluster, team, "old-trainer-0")
        assert "bound by gpu-scheduler (cut-over): holds GPUs 0,1 of its gpu-scheduling-map" in row
        # The old pod gone, its GPUs are free for the map pod at once.
        cluster.request(
            "DELETE", f"/api/v1/namespaces/{team}/pods/old-trainer-0?gracePeriodSeconds=0"
        )
        placed = wait_for("new-0 bound", lambda: bound(cluster, team, "new-0"))
        assert placed["metadata"]["annotations"][DEVICES_ANNOTATION] == gpu_uuid(node, 1)


def test_a_renumbered_node_marks_its_bound_pods_and_maps(
    cluster: LocalCluster, team_and_tenant: tuple[str, str], node: str
) -> None:
    team, _ = team_and_tenant
    apply_map(cluster, team, "r", map_yaml(team, "r", [(0, node, [1]), (1, node, [2])]))
    with solo_controller(cluster, "renumber") as proc:
        for name in ("r-0", "r-1"):
            create(cluster, f"/api/v1/namespaces/{team}/pods", map_pod(name, "r"))
        first = wait_for("r-0 bound", lambda: bound(cluster, team, "r-0"))
        wait_for("r-1 bound", lambda: bound(cluster, team, "r-1"))
        assert first["metadata"]["annotations"][CUDA_ANNOTATION] == "1"
        # The agent reports the node's GPUs 1 and 3 swapped (a reboot renumbered them).
        before = inventory_for(node, 4)
        swapped = {1: 3, 3: 1}
        publish_inventory(
            cluster,
            dataclasses.replace(
                before,
                devices=tuple(
                    dataclasses.replace(d, index=swapped.get(d.index, d.index))
                    for d in before.devices
                ),
            ),
        )

        def renumbered(name: str) -> dict[str, Any] | None:
            pod = get_pod(cluster, team, name) or {}
            for cond in pod.get("status", {}).get("conditions") or []:
                if cond["type"] == "DevicesRenumbered" and cond["status"] == "True":
                    return dict(cond)
            return None

        condition = wait_for("r-0 marked DevicesRenumbered", lambda: renumbered("r-0"))
        assert f"index 1 was {gpu_uuid(node, 1)} (now index 3)" in condition["message"]
        assert f"now names {gpu_uuid(node, 3)}" in condition["message"]
        assert renumbered("r-1") is None  # GPU 2 kept its number
        wait_for(
            "the Event",
            lambda: any(e["reason"] == "DevicesRenumbered" for e in events(cluster, team, "r-0")),
        )
        status = wait_for(
            "the map status counts it",
            lambda: (
                (st := map_status(cluster, team, "r")) and st["slots"].get("renumbered") == 1 and st
            ),
        )
        assert "1 pod(s) on renumbered GPUs" in status["message"]
        assert metric(proc, "gpuplace_renumbered_pods") == 1
        row = status_row(cluster, team, "r-0")
        assert "DevicesRenumbered: GPUs of node" in row


def test_pods_bound_before_signing_began_keep_their_gpus(
    cluster: LocalCluster, team_and_tenant: tuple[str, str], node: str
) -> None:
    team, _ = team_and_tenant
    old = map_pod("old-0", "owner")
    create(cluster, f"/api/v1/namespaces/{team}/pods", old)
    binding = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": "old-0", "annotations": forged_annotations(team, node, [0, 1])},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }
    create(cluster, f"/api/v1/namespaces/{team}/pods/old-0/binding", binding)
    # An installation that signed nothing yet: no binding key until the upgraded controller runs.
    time.sleep(1.1)  # creation times have a resolution of one second
    cluster.request("DELETE", "/api/v1/namespaces/gpuplace-system/secrets/gpuplace-binding-key")
    apply_map(cluster, team, "owner", map_yaml(team, "owner", [(0, node, [0, 1]), (1, node, [2])]))
    with solo_controller(cluster, "upgrade") as proc:
        wait_for("the controller leads", lambda: "leading:" in proc.log())
        create(cluster, f"/api/v1/namespaces/{team}/pods", map_pod("owner-0", "owner"))
        wait_for("owner-0 waits", lambda: pending_reason(cluster, team, "owner-0") == "SlotTaken")
        assert not any(e["reason"] == "BindingUnverified" for e in events(cluster, team, "old-0"))
