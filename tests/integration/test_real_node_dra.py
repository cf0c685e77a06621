"""dra enforcement on the local cluster's real node: the fake GPU DRA driver (hack/dra-driver)
publishes the node's fake NVML GPUs as its ResourceSlice, the binder allocates each pod's claim to
its declared GPUs, the kubelet has the driver prepare exactly that allocation (CDI), and the
assertions read what the gpu-probe container itself printed."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from gpuplace_dev.demo.components import Components, demo_uuid
from gpuplace_dev.demo.realnode import printed as report
from gpuplace_dev.localcluster import REAL_NODE_NAME, LocalCluster
from placement.annotations import MAP_LABEL, PLACEMENT_MAP_LABEL
from placement.inventory import INVENTORY_NAMESPACE
from placement.model import MODEL_NAMESPACE
from tests.integration.controllerkit import map_yaml, wait_for
from tests.integration.test_real_node import (
    GPUS,
    NODE_NUMBER,
    bound_map,
    create_pod,
    logs,
    probe_pod,
    wait_running,
)


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
        config = components.agent(REAL_NODE_NAME, GPUS, interval=1.0, number=NODE_NUMBER)
        components.dra_driver(config)
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
                len(s["spec"].get("devices") or []) == GPUS for s in body["items"]
            )

        wait_for("the DRA driver's ResourceSlice for the real node", published, timeout=90)
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
