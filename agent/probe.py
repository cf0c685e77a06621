"""What the agent knows about its node's GPUs, behind a small Protocol.

`agent.nvml.NvmlProbe` reads real devices through pynvml and is the only probe that reports GPUs
in the agent binary; `EmptyProbe` stands in for it on a node without NVML when the operator asked
for an empty inventory (--publish-empty); `MemoryProbe` holds devices in memory for unit tests of
everything above the probe.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterable
from typing import Protocol

from placement.inventory import GpuDevice, NodeInventory
from placement.types import NodeName


class ProbeError(Exception):
    """NVML failed in a way that leaves the whole node's inventory unknown."""


#: What an operator can do about a node without NVML.
NVML_ABSENT_HINT = (
    "install the NVIDIA driver on this node and give the agent the NVIDIA container runtime "
    "(or mount libnvidia-ml.so.1 into it), or pass --publish-empty to publish an empty inventory"
)


class NvmlUnavailableError(ProbeError):
    """This node has no usable NVML: the library cannot be loaded or the driver is not running."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"NVML is not available on this node: {reason}; {NVML_ABSENT_HINT}")
        self.reason = reason


class GpuProbe(Protocol):
    """Reads the node's GPUs. One loop drives a probe; implementations need not be thread-safe."""

    def snapshot(self, node: NodeName) -> NodeInventory:
        """Every GPU with its health now, including what health events reported since the last
        snapshot. A device that cannot be queried is listed, unhealthy, with the reason.
        Raises ProbeError when the devices cannot be enumerated at all."""
        ...

    def wait(self, timeout_s: float) -> bool:
        """Blocks up to `timeout_s` seconds; returns True early when a health event arrived
        (take a snapshot to see it), False when the time ran out."""
        ...

    def close(self) -> None: ...


class EmptyProbe:
    """A node without NVML, reported as having no GPUs (`--publish-empty`)."""

    def __init__(self) -> None:
        self._closed = threading.Event()

    def snapshot(self, node: NodeName) -> NodeInventory:
        return NodeInventory(node)

    def wait(self, timeout_s: float) -> bool:
        self._closed.wait(max(timeout_s, 0.0))
        return False

    def close(self) -> None:
        self._closed.set()


class MemoryProbe:
    """Devices held in memory; tests change them with `set_devices` and `mark_unhealthy`."""

    def __init__(
        self,
        devices: Iterable[GpuDevice] = (),
        *,
        driver_version: str = "",
        cuda_driver_version: str = "",
    ) -> None:
        self._lock = threading.Lock()
        self._changed = threading.Event()
        self._devices = tuple(devices)
        self.driver_version = driver_version
        self.cuda_driver_version = cuda_driver_version
        self.closed = False

    def set_devices(self, devices: Iterable[GpuDevice]) -> None:
        with self._lock:
            self._devices = tuple(devices)
        self._changed.set()

    def mark_unhealthy(self, index: int, reason: str) -> None:
        with self._lock:
            if not any(d.index == index for d in self._devices):
                raise KeyError(f"no device with index {index}")
            self._devices = tuple(
                dataclasses.replace(d, healthy=False, health_reason=reason)
                if d.index == index
                else d
                for d in self._devices
            )
        self._changed.set()

    def snapshot(self, node: NodeName) -> NodeInventory:
        with self._lock:
            devices = self._devices
        return NodeInventory(node, devices, self.driver_version, self.cuda_driver_version)

    def wait(self, timeout_s: float) -> bool:
        changed = self._changed.wait(max(timeout_s, 0.0))
        self._changed.clear()
        return changed

    def close(self) -> None:
        self.closed = True
