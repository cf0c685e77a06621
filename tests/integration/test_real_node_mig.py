"""A MIG slot on the real node in envMode index: the agent reports GPU 0's MIG instances (fake
NVML library), the controller resolves the slot to one of them, and the container itself prints
CUDA_VISIBLE_DEVICES=MIG-<uuid>, not the parent's index."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpuplace_dev.demo.components import Components
from gpuplace_dev.localcluster import REAL_NODE_NAME, LocalCluster
from placement.annotations import CUDA_ANNOTATION, DEVICES_ANNOTATION, INDEX_LABEL, MAP_LABEL
from placement.inventory import INVENTORY_KEY, INVENTORY_NAMESPACE
from placement.model import MODEL_NAMESPACE
from tests.integration.controllerkit import wait_for
from tests.integration.test_real_node import (
    GPUS,
    NODE_NUMBER,
    bound_map,
    create_pod,
    logs,
    probe_pod,
    wait_running,
)
from tests.integration.test_real_node import report as printed

pytestmark = pytest.mark.integration

#: GPU 0's two 3g.40gb instances; the slot gets the one with the lower placement start.
MIG_UUIDS = ("MIG-0000000a-0000-4000-8000-000000000004", "MIG-0000000a-0000-4000-8000-000000000000")
MIG_INSTANCES: list[dict[str, object]] = [
    {
        "uuid": MIG_UUIDS[0],
        "profile": "3g.40gb",
        "index": 0,
        "placement": {"start": 4, "size": 4},
        "memoryMiB": 40320,
    },
    {
        "uuid": MIG_UUIDS[1],
        "profile": "3g.40gb",
        "index": 1,
        "placement": {"start": 0, "size": 4},
        "memoryMiB": 40320,
    },
]


@pytest.fixture(scope="module")
def gpuplace_mig(
    real_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    for namespace in (MODEL_NAMESPACE, INVENTORY_NAMESPACE):
        real_cluster.create_namespace(namespace)
    components = Components(real_cluster, tmp_path_factory.mktemp("components-mig"))
    try:
        components.agent(
            REAL_NODE_NAME, GPUS, interval=1.0, number=NODE_NUMBER, mig={0: MIG_INSTANCES}
        )
        components.controller()
        components.webhook()

        def ready() -> bool:
            components.check_alive()
            status, cm = real_cluster.request(
                "GET", f"/api/v1/namespaces/{INVENTORY_NAMESPACE}/configmaps/{REAL_NODE_NAME}"
            )
            return status == 200 and MIG_UUIDS[1] in (cm.get("data") or {}).get(INVENTORY_KEY, "")

        wait_for("the agent's inventory with MIG instances", ready, timeout=90)
        yield
    finally:
        components.stop()


def test_a_mig_slot_container_sees_its_mig_uuid(
    real_cluster: LocalCluster, gpuplace_mig: None
) -> None:
    ns = "real-mig"
    real_cluster.create_namespace(ns)
    text = f"""\
apiVersion: gpuplace.io/v1alpha1
kind: PlacementMap
metadata:
  name: mig
  namespace: {ns}
spec:
  envMode: index
  placements:
    - index: 0
      node: {REAL_NODE_NAME}
      mig: {{gpu: 0, profile: 3g.40gb}}
"""
    bound_map(real_cluster, ns, "mig", text)
    create_pod(real_cluster, probe_pod("mig-0", ns, labels={MAP_LABEL: "mig", INDEX_LABEL: "0"}))
    pod = wait_running(real_cluster, ns, "mig-0")
    annotations = pod["metadata"]["annotations"]
    assert annotations[DEVICES_ANNOTATION] == MIG_UUIDS[1]
    assert annotations[CUDA_ANNOTATION] == MIG_UUIDS[1]
    assert (
        printed(logs(real_cluster, ns, "mig-0", "-c", "probe"))["CUDA_VISIBLE_DEVICES"]
        == (MIG_UUIDS[1])
    )
