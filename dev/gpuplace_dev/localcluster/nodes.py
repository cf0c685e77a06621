"""Fake GPU nodes: Node objects that kwok manages (Ready, heartbeats, pods turn Running)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: kwok manages the nodes that carry this annotation (the launcher starts kwok with its selector).
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_NODE_VALUE = "fake"
GPU_RESOURCE = "nvidia.com/gpu"

_DEFAULT_CAPACITY: Mapping[str, str] = {"cpu": "64", "memory": "512Gi", "pods": "110"}


@dataclass(frozen=True)
class FakeNode:
    """A node for kwok to manage.

    ``capacity`` adds to (or overrides) cpu 64, memory 512Gi, pods 110 and ``nvidia.com/gpu``
    = ``gpus``; allocatable equals capacity.
    """

    name: str
    gpus: int = 8
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    capacity: Mapping[str, str] = field(default_factory=dict)

    def manifest(self) -> dict[str, Any]:
        """The Node object to create."""
        capacity = {**_DEFAULT_CAPACITY, GPU_RESOURCE: str(self.gpus), **self.capacity}
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.name,
                "labels": {
                    "kubernetes.io/hostname": self.name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    "type": "kwok",
                    **self.labels,
                },
                "annotations": {
                    # The node controller would otherwise wait for a kubelet to set the TTL.
                    "node.alpha.kubernetes.io/ttl": "0",
                    **self.annotations,
                    KWOK_NODE_ANNOTATION: KWOK_NODE_VALUE,
                },
            },
            "spec": {},
            "status": {"capacity": capacity, "allocatable": dict(capacity)},
        }


def fake_gpu_nodes(
    count: int,
    *,
    gpus: int = 8,
    prefix: str = "gpu-node-",
    labels: Mapping[str, str] | None = None,
    width: int = 2,
) -> list[FakeNode]:
    """``count`` nodes named ``<prefix>01``, ``<prefix>02``, ... (zero-padded to ``width``)."""
    return [
        FakeNode(name=f"{prefix}{i:0{width}d}", gpus=gpus, labels=dict(labels or {}))
        for i in range(1, count + 1)
    ]
