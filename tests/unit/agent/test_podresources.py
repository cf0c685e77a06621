"""The agent's client of the kubelet's PodResources API, against a gRPC server on a unix socket
that answers as a kubelet does (the v1 wire format), and what its answer comes to in GPUs."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from agent.podresources import LIST_METHOD, PodResourcesError, encode_response, list_pod_resources
from placement.podresources import ClaimDevice, PodResources, plugin_gpus
from placement.types import NodeName

GPU0 = "GPU-00000001-0000-4000-8000-000000000000"
GPU1 = "GPU-00000001-0000-4000-8000-000000000001"

KUBELET_ANSWER = [
    {
        "name": "llm-0",
        "namespace": "ml",
        "containers": [
            {
                "name": "main",
                "devices": [
                    {"resource_name": "nvidia.com/gpu", "device_ids": [GPU0, f"{GPU1}::2"]},
                    {"resource_name": "example.com/nic", "device_ids": ["nic0"]},
                ],
            }
        ],
    },
    {
        "name": "dra-0",
        "namespace": "ml",
        "containers": [
            {
                "name": "main",
                "dynamic_resources": [
                    {
                        "claim_name": "dra-0-gpu",
                        "claim_namespace": "ml",
                        "claim_resources": [
                            {
                                "driver_name": "gpu.nvidia.com",
                                "pool_name": "n1",
                                "device_name": "gpu-3",
                            }
                        ],
                    }
                ],
            }
        ],
    },
    {"name": "cpu-only", "namespace": "ml", "containers": [{"name": "c"}]},
]


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[str]:
    socket = str(tmp_path / "kubelet.sock")
    answer = encode_response(KUBELET_ANSWER)

    def handle(request: bytes, context: grpc.ServicerContext) -> bytes:
        return answer

    handler = grpc.method_handlers_generic_handler(
        "v1.PodResourcesLister",
        {"List": grpc.unary_unary_rpc_method_handler(handle)},
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"unix://{socket}")
    server.start()
    try:
        yield socket
    finally:
        server.stop(None)


def test_the_agent_reads_plugin_and_dra_devices_from_the_kubelet(kubelet: str) -> None:
    assert LIST_METHOD == "/v1.PodResourcesLister/List"
    record = list_pod_resources(kubelet, NodeName("n1"))
    assert [(p.namespace, p.name) for p in record.pods] == [("ml", "dra-0"), ("ml", "llm-0")]
    llm = record.pod("ml", "llm-0")
    assert llm is not None
    assert plugin_gpus(llm.plugin) == ((GPU0, GPU1), ())
    dra = record.pod("ml", "dra-0")
    assert dra is not None
    assert dra.claims == (ClaimDevice("ml", "dra-0-gpu", "gpu.nvidia.com", "n1", "gpu-3"),)
    # What the agent publishes reads back as it was.
    assert PodResources.from_json(record.to_json()) == record


def test_a_missing_socket_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(PodResourcesError, match="no kubelet pod-resources socket"):
        list_pod_resources(str(tmp_path / "none.sock"), NodeName("n1"))


def test_mig_devices_and_other_ids_are_no_whole_gpu() -> None:
    found = plugin_gpus([("nvidia.com/gpu", "MIG-abc"), ("nvidia.com/gpu", GPU0)])
    assert found == ((GPU0,), ("MIG-abc",))
    with pytest.raises(ValueError, match="malformed pod resources"):
        PodResources.from_json('{"pods": []}')
