"""dra enforcement on the local cluster's real node: the fake GPU DRA driver (hack/dra-driver)
publishes the node's fake NVML GPUs as its ResourceSlice, the binder allocates each pod's claim to
its declared GPUs, the kubelet has the driver prepare exactly that allocation (CDI), and the
assertions read what the gpu-probe container itself printed. GPU 0 is in MIG mode with two
3g.40gb instances, which the driver publishes as `type: mig` devices."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from gpuplace_dev.demo.components import Components, demo_uuid
from gpuplace_dev.demo.realnode import printed as report
from gpuplace_dev.localcluster import REAL_NODE_NAME, LocalCluster
from placement.annotations import DEVICES_ANNOTATION, MAP_LABEL, PLACEMENT_MAP_LABEL
from placement.inventory import INVENTORY_NAMESPACE
from placement.model import MODEL_NAMESPACE
from tests.integration.controllerkit import get_pod, map_yaml, wait_for
from tests.integration.test_real_node import (
    GPUS,
    NODE_NUMBER,
    bound_map,
    create_pod,
    logs,
    probe_pod,
    wait_running,
)

XID_TAINT = {"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}
#: GPU 0's MIG instances (the other GPUs are whole), in the fake NVML library's format.
MIG_UUIDS = ("MIG-00000009-0000-4000-8000-000000000000", "MIG-00000009-0000-4000-8000-000000000004")
MIG_INSTANCES: list[dict[str, object]] = [
    {
        "uuid": uuid,
        "profile": "3g.40gb",
        "index": n,
        "placement": {"start": 4 * n, "size": 4},
        "memoryMiB": 40320,
    }
    for n, uuid in enumerate(MIG_UUIDS)
]


@pytest.fixture(scope="module")
def gpuplace_dra(
    real_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """The agent and the fake DRA driver for the real node (the same 4 fake GPUs), the
    controller and the webhook in dra enforcement."""
    for namespace in (MODEL_NAMESPACE, INVENTORY_NAMESPACE):
        real_cluster.create_namespace(namespace)
    components = Components(real_cluster, tmp_path_factory.mktemp("components-dra"))
    try:
        config = components.agent(
            REAL_NODE_NAME, GPUS, interval=1.0, number=NODE_NUMBER, mig={0: MIG_INSTANCES}
        )
        taints = config.with_name("taints.json")
        taints.write_text(json.dumps({demo_uuid(NODE_NUMBER, 0): [XID_TAINT]}))
        components.dra_driver(config, taints)
        components.controller(enforcement="dra")
        components.webhook(enforcement="dra")

        def published() -> bool:
            components.check_alive()
            status, body = real_cluster.request(
                "GET",
                "/apis/resource.k8s.io/v1/resourceslices"
                f"?fieldSelector=spec.nodeName={REAL_NODE_NAME}",
            )
            return status == 200 and any(
                len(s["spec"].get("devices") or []) == GPUS + len(MIG_UUIDS) for s in body["items"]
            )

        def devices() -> dict[str, dict[str, Any]]:
            _, body = real_cluster.request(
                "GET",
                "/apis/resource.k8s.io/v1/resourceslices"
                f"?fieldSelector=spec.nodeName={REAL_NODE_NAME}",
            )
            return {d["name"]: d for s in body["items"] for d in s["spec"].get("devices") or []}

        wait_for("the DRA driver's ResourceSlice for the real node", published, timeout=90)
        # GPU 0 (in MIG mode, so no slot holds it whole) carries the taint of the driver's file;
        # its instances are devices of their own, untainted.
        found = devices()
        # (The apiserver stamps each taint's timeAdded.)
        (taint,) = found["gpu-0"]["taints"]
        assert {k: taint[k] for k in XID_TAINT} == XID_TAINT, taint
        mig = found["gpu-0-mig-3g-40gb-4"]
        assert "taints" not in mig
        assert {k: v["string"] for k, v in mig["attributes"].items() if "string" in v} == {
            "type": "mig",
            "uuid": MIG_UUIDS[1],
            "parentUUID": demo_uuid(NODE_NUMBER, 0),
            "profile": "3g.40gb",
            "productName": "NVIDIA H100 80GB HBM3",
        }
        yield
    finally:
        components.stop()
        # The next module's webhook registers itself under the same name; a configuration left
        # pointing at this one's closed port would refuse its maps until then.
        for kind in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
            real_cluster.request("DELETE", f"/apis/admissionregistration.k8s.io/v1/{kind}/gpuplace")


@pytest.fixture
def ns(real_cluster: LocalCluster, gpuplace_dra: None) -> Iterator[str]:
    name = f"real-dra-{uuid.uuid4().hex[:6]}"
    real_cluster.create_namespace(name)
    yield name
    # Maps go first, synchronously: until the namespace is gone its maps would still claim the
    # real node's GPUs, and the next module's maps would read as conflicting with them.
    real_cluster.request(
        "DELETE", f"/api/v1/namespaces/{name}/configmaps?labelSelector={PLACEMENT_MAP_LABEL}%3Dtrue"
    )
    # Pods next, while the DRA driver still runs: the kubelet asks it to unprepare their claims
    # before the pods can go, and the GPUs they hold are free for the next module only then.
    real_cluster.request("DELETE", f"/api/v1/namespaces/{name}/pods")
    wait_for(
        f"the pods of {name} gone",
        lambda: not real_cluster.request("GET", f"/api/v1/namespaces/{name}/pods")[1]["items"],
        timeout=90,
    )
    real_cluster.delete_namespace(name)


def test_each_container_sees_exactly_its_declared_gpus_and_another_maps_pod_only_its_own(
    real_cluster: LocalCluster, ns: str
) -> None:
    node = REAL_NODE_NAME
    bound_map(real_cluster, ns, "train", map_yaml(ns, "train", [(0, node, [1, 3])]))
    bound_map(real_cluster, ns, "serve", map_yaml(ns, "serve", [(0, node, [2])]))
    create_pod(real_cluster, probe_pod("train-0", ns, labels={MAP_LABEL: "train"}))
    create_pod(real_cluster, probe_pod("serve-0", ns, labels={MAP_LABEL: "serve"}))
    wanted = {
        "train-0": [demo_uuid(NODE_NUMBER, 1), demo_uuid(NODE_NUMBER, 3)],
        "serve-0": [demo_uuid(NODE_NUMBER, 2)],
    }
    for name, uuids in wanted.items():
        wait_running(real_cluster, ns, name)
        for container in ("probe", "init"):
            seen = report(logs(real_cluster, ns, name, "-c", container))
            # What the driver prepared (its CDI edits) and what gpuplace wired agree, and name
            # exactly the declared GPUs: no other GPU of the node appears anywhere.
            assert seen["NVIDIA_VISIBLE_DEVICES"] == ",".join(uuids), seen
            assert seen["CUDA_VISIBLE_DEVICES"] == ",".join(uuids), seen
            named = {v.split("=", 1)[1] for k, v in seen.items() if k.startswith("GPU_DEVICE_")}
            assert named == set(uuids), seen
            others = {demo_uuid(NODE_NUMBER, i) for i in range(GPUS)} - set(uuids)
            assert not any(o in " ".join(seen.values()) for o in others), seen


def test_a_mig_slots_container_sees_exactly_its_mig_instance(
    real_cluster: LocalCluster, ns: str
) -> None:
    node = REAL_NODE_NAME
    slots = [
        f"    - index: {i}\n      node: {node}\n      mig: {{gpu: 0, profile: 3g.40gb}}"
        for i in range(2)
    ]
    text = map_yaml(ns, "mig", []) + "\n".join(slots) + "\n"
    bound_map(real_cluster, ns, "mig", text)
    for i in range(2):
        create_pod(real_cluster, probe_pod(f"mig-{i}", ns, labels={MAP_LABEL: "mig"}))
    held = []
    for i in range(2):
        wait_running(real_cluster, ns, f"mig-{i}")
        pod = get_pod(real_cluster, ns, f"mig-{i}")
        assert pod is not None
        (instance,) = pod["metadata"]["annotations"][DEVICES_ANNOTATION].split(",")
        assert instance in MIG_UUIDS
        held.append(instance)
        seen = report(logs(real_cluster, ns, f"mig-{i}", "-c", "probe"))
        # The driver prepared the MIG device (its CDI edits) and gpuplace wired the same UUID:
        # an index, or the parent's UUID, would name the whole GPU.
        assert seen["NVIDIA_VISIBLE_DEVICES"] == instance, seen
        assert seen["CUDA_VISIBLE_DEVICES"] == instance, seen
        named = {v.split("=", 1)[1] for k, v in seen.items() if k.startswith("GPU_DEVICE_")}
        assert named == {instance}, seen
        others = {demo_uuid(NODE_NUMBER, g) for g in range(GPUS)} | set(MIG_UUIDS) - {instance}
        assert not any(o in " ".join(seen.values()) for o in others), seen
    assert sorted(held) == sorted(MIG_UUIDS)
