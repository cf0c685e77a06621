"""How the node's GPUs are joined: NVLink peers and PCIe switch peers, through pynvml.

Both only guide which GPUs `count` prefers, so no failure here makes a GPU unhealthy: a GPU or
driver without NVLink (NOT_SUPPORTED, or an old library without the function) has no NVLink
peers, a driver that cannot say the PCIe topology reports no switch peers.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import pynvml

from placement.types import GpuUuid

log = logging.getLogger(__name__)

_UNSUPPORTED: tuple[type[pynvml.NVMLError], ...] = (
    pynvml.NVMLError_NotSupported,
    pynvml.NVMLError_FunctionNotFound,
)
#: Common ancestors that are a PCIe switch (one, or several in a row).
_SWITCH_LEVELS = frozenset({pynvml.NVML_TOPOLOGY_SINGLE, pynvml.NVML_TOPOLOGY_MULTIPLE})


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def bus_key(pci_bus_id: str) -> str:
    """A PCI address in one spelling, whatever the domain width and case NVML used:
    "0000:3b:00.0" and "00000000:3B:00.0" both give "00000000:3b:00.0"."""
    domain, _, rest = pci_bus_id.strip().partition(":")
    try:
        return f"{int(domain, 16):08x}:{rest.lower()}"
    except ValueError:
        return pci_bus_id.strip().lower()


def nvlink_peers(
    handle: Any, index: int, gpus_by_bus: Mapping[str, GpuUuid]
) -> tuple[GpuUuid, ...]:
    """The local GPUs that an active NVLink of this GPU leads to, each once, in link order.
    `gpus_by_bus` maps `bus_key` of every local GPU's PCI address to its UUID."""
    peers: list[GpuUuid] = []
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        try:
            active = int(pynvml.nvmlDeviceGetNvLinkState(handle, link))
        except _UNSUPPORTED:
            if link == 0:
                return ()  # no NVLink on this GPU: spare the other 35 calls
            continue
        except pynvml.NVMLError_InvalidArgument:
            break  # past this GPU's last link
        except pynvml.NVMLError as exc:
            log.debug("GPU %d NVLink %d: state unknown: %s", index, link, exc)
            continue
        if not active:
            continue
        try:
            remote = bus_key(_text(pynvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId))
        except pynvml.NVMLError as exc:
            log.debug("GPU %d NVLink %d: remote end unknown: %s", index, link, exc)
            continue
        peer = gpus_by_bus.get(remote)
        if peer is None:
            log.debug(
                "GPU %d NVLink %d leads to %s, not a GPU of this node (an NVSwitch or another "
                "device): not counted as a peer",
                index,
                link,
                remote,
            )
        elif peer not in peers:
            peers.append(peer)
    return tuple(peers)


def pcie_switch_peers(gpus: Sequence[tuple[GpuUuid, Any]]) -> dict[GpuUuid, tuple[GpuUuid, ...]]:
    """For each GPU (UUID, handle), the others whose closest common PCIe ancestor is a switch."""
    peers: dict[GpuUuid, list[GpuUuid]] = {uuid: [] for uuid, _ in gpus}
    for i, (first, first_handle) in enumerate(gpus):
        for second, second_handle in gpus[i + 1 :]:
            try:
                level = int(pynvml.nvmlDeviceGetTopologyCommonAncestor(first_handle, second_handle))
            except _UNSUPPORTED as exc:
                log.debug("the driver reports no PCIe topology: %s", exc)
                return {}
            except pynvml.NVMLError as exc:
                log.debug("PCIe topology of %s and %s unknown: %s", first, second, exc)
                continue
            if level in _SWITCH_LEVELS:
                peers[first].append(second)
                peers[second].append(first)
    return {uuid: tuple(found) for uuid, found in peers.items() if found}
