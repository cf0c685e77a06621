"""`NvmlProbe`: the node's GPUs through pynvml, NVIDIA's ctypes binding of libnvidia-ml.so.1.

Health has two sources. A device that NVML cannot query (its handle, UUID, name, memory or PCI
info fails) is unhealthy for as long as that lasts, with the failing call as the reason. A device
that reported a critical XID through an NVML event set is unhealthy until the agent restarts, as
the NVIDIA device plugin does: after a critical XID the GPU needs a reset or a drain, and a
driver that stops repeating the error has not proven it healthy. With `xid_recovery_seconds` set,
a device that reports no further critical XID for that long is healthy again (each XID starts the
wait over): for fleets that reset GPUs in place rather than restart the agent.

Each GPU also carries its MIG devices (`agent.nvmlmig`) and its NVLink and PCIe switch peers
(`agent.nvmltopology`); neither ever makes a GPU unhealthy.
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import time
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import Any

import pynvml

from agent import xid
from agent.nvmlmig import read_mig
from agent.nvmltopology import bus_key, nvlink_peers, pcie_switch_peers
from agent.probe import NvmlUnavailableError, ProbeError
from placement.inventory import GpuDevice, NodeInventory
from placement.types import GpuUuid, NodeName

log = logging.getLogger(__name__)

MIB = 1024 * 1024
_XID_EVENT = int(pynvml.nvmlEventTypeXidCriticalError)
#: Events read per snapshot at most: a device that floods events must not stall the agent.
_MAX_DRAIN = 1024


class _Event(Enum):
    NONE = "none"  # the wait timed out
    IGNORED = "ignored"  # an event that does not change health
    HEALTH = "health"  # a device turned unhealthy
    FAILED = "failed"  # the wait itself failed


class _QueryFailedError(Exception):
    def __init__(self, call: str, error: Exception) -> None:
        super().__init__(f"{call}: {error}")
        self.call = call


@dataclasses.dataclass(slots=True)
class _Reading:
    """What one device answered before a query failed (fields stay empty past the failure)."""

    uuid: str = ""
    name: str = ""
    memory_mib: int = 0
    pci_bus_id: str = ""
    numa_node: int | None = None


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _query(call: str, fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return fn(*args)
    except pynvml.NVMLError as exc:
        raise _QueryFailedError(call, exc) from exc


def _address(handle: Any) -> int:
    return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)


def _initialize() -> None:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError_LibraryNotFound as exc:
        raise NvmlUnavailableError("libnvidia-ml.so.1 cannot be loaded") from exc
    except pynvml.NVMLError_DriverNotLoaded as exc:
        raise NvmlUnavailableError(
            f"libnvidia-ml.so.1 was loaded but the NVIDIA driver is not running ({exc})"
        ) from exc
    except pynvml.NVMLError as exc:
        raise ProbeError(f"NVML initialization failed: {exc}") from exc


def _cuda_driver_version() -> str:
    """The newest CUDA version the driver supports, as "12.4" ("" when NVML cannot say)."""
    try:
        try:
            value = int(pynvml.nvmlSystemGetCudaDriverVersion_v2())
        except pynvml.NVMLError_FunctionNotFound:
            value = int(pynvml.nvmlSystemGetCudaDriverVersion())
    except pynvml.NVMLError as exc:
        log.warning("NVML cannot report the CUDA driver version: %s", exc)
        return ""
    return f"{value // 1000}.{value % 1000 // 10}"


def sysfs_numa_node(sysfs: Path, pci_bus_id: str) -> int | None:
    """The NUMA node Linux reports for a PCI device; None when unknown or not a NUMA system."""
    domain, sep, rest = pci_bus_id.partition(":")
    if not sep:
        return None
    # NVML writes an 8-digit domain ("00000000:17:00.0"); sysfs uses 4 digits, lower case.
    path = sysfs / "bus" / "pci" / "devices" / f"{domain[-4:]}:{rest}".lower() / "numa_node"
    try:
        value = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    return value if value >= 0 else None


class NvmlProbe:
    """Reads the GPUs of this node through NVML. Raises NvmlUnavailableError when there is no
    NVML, ProbeError when NVML is present but fails to start. Not thread-safe."""

    def __init__(
        self,
        *,
        ignored_xids: frozenset[int] = xid.APPLICATION_XIDS,
        sysfs: Path = Path("/sys"),
        xid_recovery_seconds: float = 0.0,
    ) -> None:
        _initialize()
        self._open = True
        self._ignored_xids = ignored_xids
        self._xid_recovery_seconds = xid_recovery_seconds  # 0: until the agent restarts
        self._sysfs = sysfs
        try:
            self.driver_version = _text(pynvml.nvmlSystemGetDriverVersion())
        except pynvml.NVMLError as exc:
            self.close()
            raise ProbeError(f"NVML cannot report the driver version: {exc}") from exc
        self.cuda_driver_version = _cuda_driver_version()
        self._events: Any = self._create_event_set()
        self._watched: set[int] = set()
        self._index_by_handle: dict[int, int] = {}
        self._xid_reasons: dict[GpuUuid, str] = {}
        self._xid_at: dict[GpuUuid, float] = {}  # monotonic time of each device's last XID
        self._last: dict[int, GpuDevice] = {}  # last complete reading per index
        self._handles: dict[int, Any] = {}  # this snapshot's fully read devices
        self._watch_all()

    # -- GpuProbe -----------------------------------------------------------------------------
    def snapshot(self, node: NodeName) -> NodeInventory:
        self._require_open()
        self._drain_events()
        self._recover()
        try:
            count = int(pynvml.nvmlDeviceGetCount())
        except pynvml.NVMLError as exc:
            raise ProbeError(f"NVML cannot count the GPUs on this node: {exc}") from exc
        self._handles.clear()
        devices = self._with_topology(tuple(self._read(index) for index in range(count)))
        return NodeInventory(node, devices, self.driver_version, self.cuda_driver_version)

    def wait(self, timeout_s: float) -> bool:
        self._require_open()
        deadline = time.monotonic() + max(timeout_s, 0.0)
        if self._events is None:
            time.sleep(max(timeout_s, 0.0))
            return False
        while True:
            remaining = deadline - time.monotonic()
            outcome = self._next_event(max(int(remaining * 1000), 0))
            if outcome is _Event.HEALTH:
                return True
            if outcome is _Event.FAILED:
                # Let the next snapshot find out what broke, but never spin on a failing wait.
                time.sleep(max(deadline - time.monotonic(), 0.0))
                return True
            if outcome is _Event.NONE or remaining <= 0:
                return False

    def close(self) -> None:
        if not self._open:
            return
        self._open = False
        events = getattr(self, "_events", None)  # absent when __init__ failed early
        if events is not None:
            try:
                pynvml.nvmlEventSetFree(events)
            except pynvml.NVMLError as exc:
                log.debug("freeing the NVML event set: %s", exc)
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError as exc:
            log.debug("NVML shutdown: %s", exc)

    # -- devices ------------------------------------------------------------------------------
    def _read(self, index: int) -> GpuDevice:
        reading = _Reading()
        try:
            handle = _query("nvmlDeviceGetHandleByIndex", pynvml.nvmlDeviceGetHandleByIndex, index)
            # Watch first: a GPU failing its other queries may still report why through XIDs.
            self._watch(index, handle)
            reading.uuid = _text(_query("nvmlDeviceGetUUID", pynvml.nvmlDeviceGetUUID, handle))
            reading.name = _text(_query("nvmlDeviceGetName", pynvml.nvmlDeviceGetName, handle))
            memory = _query("nvmlDeviceGetMemoryInfo", pynvml.nvmlDeviceGetMemoryInfo, handle)
            reading.memory_mib = int(memory.total) // MIB
            pci = _query("nvmlDeviceGetPciInfo", pynvml.nvmlDeviceGetPciInfo, handle)
            reading.pci_bus_id = _text(pci.busId)
            reading.numa_node = self._numa_node(handle, reading.pci_bus_id)
        except _QueryFailedError as failed:
            return self._unqueryable(index, reading, failed)
        mig_mode, mig_instances = read_mig(handle, index)
        device = GpuDevice(
            index=index,
            uuid=GpuUuid(reading.uuid),
            name=reading.name,
            memory_mib=reading.memory_mib,
            pci_bus_id=reading.pci_bus_id,
            numa_node=reading.numa_node,
            mig_mode=mig_mode,
            mig_instances=mig_instances,
        )
        self._handles[index] = handle
        self._last[index] = device
        reason = self._xid_reasons.get(device.uuid)
        if reason:
            return dataclasses.replace(device, healthy=False, health_reason=reason)
        return device

    def _unqueryable(self, index: int, reading: _Reading, failed: _QueryFailedError) -> GpuDevice:
        # A GPU that fell off the bus cannot say who it is. What it said before the failing call
        # is kept; the rest comes from its last full reading, if that was the same GPU, so that
        # maps naming it by UUID learn that it is unhealthy rather than gone.
        last = self._last.get(index)
        if last is None or reading.uuid not in ("", last.uuid):
            last = GpuDevice(index, GpuUuid(""))
        uuid = GpuUuid(reading.uuid or last.uuid)
        reasons = [f"NVML cannot query the device ({failed})"]
        if uuid in self._xid_reasons:
            reasons.append(self._xid_reasons[uuid])
        log.debug("GPU %d is unhealthy: %s", index, failed)
        return GpuDevice(
            index=index,
            uuid=uuid,
            name=reading.name or last.name,
            memory_mib=reading.memory_mib or last.memory_mib,
            pci_bus_id=reading.pci_bus_id or last.pci_bus_id,
            healthy=False,
            health_reason="; ".join(reasons),
            numa_node=reading.numa_node if reading.numa_node is not None else last.numa_node,
            # Its MIG devices and links as last seen, so that slots on them read as unhealthy
            # rather than missing while the GPU cannot answer.
            mig_mode=last.mig_mode,
            mig_instances=last.mig_instances,
            nvlink_peers=last.nvlink_peers,
            pcie_switch_peers=last.pcie_switch_peers,
        )

    def _with_topology(self, devices: tuple[GpuDevice, ...]) -> tuple[GpuDevice, ...]:
        """Adds the NVLink and PCIe switch peers of every device this snapshot read fully."""
        by_index = {d.index: d for d in devices}
        read = [(by_index[i].uuid, h) for i, h in sorted(self._handles.items())]
        gpus_by_bus = {bus_key(d.pci_bus_id): d.uuid for d in devices if d.pci_bus_id}
        switch_peers = pcie_switch_peers(read)
        for index, handle in self._handles.items():
            device = by_index[index]
            by_index[index] = dataclasses.replace(
                device,
                nvlink_peers=nvlink_peers(handle, index, gpus_by_bus),
                pcie_switch_peers=switch_peers.get(device.uuid, ()),
            )
            self._last[index] = dataclasses.replace(by_index[index], healthy=True, health_reason="")
        return tuple(by_index[d.index] for d in devices)

    def _numa_node(self, handle: Any, pci_bus_id: str) -> int | None:
        getter = getattr(pynvml, "nvmlDeviceGetNumaNodeId", None)
        if getter is not None:
            try:
                value = int(getter(handle))
            except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound):
                pass  # older drivers; Linux knows too
            except pynvml.NVMLError as exc:
                raise _QueryFailedError("nvmlDeviceGetNumaNodeId", exc) from exc
            else:
                return value if value >= 0 else None
        return sysfs_numa_node(self._sysfs, pci_bus_id)

    # -- events -------------------------------------------------------------------------------
    def _create_event_set(self) -> Any:
        try:
            return pynvml.nvmlEventSetCreate()
        except pynvml.NVMLError as exc:
            log.warning(
                "NVML event sets are not available (%s): XID errors will not mark GPUs "
                "unhealthy, only failing queries will",
                exc,
            )
            return None

    def _watch_all(self) -> None:
        """Registers every GPU at start, so that the first snapshot already sees the XIDs that
        arrive from then on (NVML does not replay events from before a registration)."""
        if self._events is None:
            return
        try:
            count = int(pynvml.nvmlDeviceGetCount())
        except pynvml.NVMLError:
            return  # the first snapshot reports it
        for index in range(count):
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            except pynvml.NVMLError:
                continue  # retried when a snapshot reaches the device
            self._watch(index, handle)

    def _watch(self, index: int, handle: Any) -> None:
        if self._events is None or index in self._watched:
            return
        self._index_by_handle[_address(handle)] = index
        try:
            supported = int(pynvml.nvmlDeviceGetSupportedEventTypes(handle))
            if supported & _XID_EVENT:
                pynvml.nvmlDeviceRegisterEvents(handle, _XID_EVENT, self._events)
            else:
                log.warning("GPU %d does not report XID events; only failing queries count", index)
        except pynvml.NVMLError_NotSupported:
            log.warning("GPU %d does not support NVML events", index)
        except pynvml.NVMLError as exc:
            log.warning("cannot watch GPU %d for XID errors (will retry): %s", index, exc)
            return
        self._watched.add(index)

    def _drain_events(self) -> None:
        if self._events is None:
            return
        for _ in range(_MAX_DRAIN):
            if self._next_event(0) in (_Event.NONE, _Event.FAILED):
                return
        log.warning("more than %d NVML events pending; reading the rest later", _MAX_DRAIN)

    def _next_event(self, timeout_ms: int) -> _Event:
        try:
            data = pynvml.nvmlEventSetWait(self._events, timeout_ms)
        except pynvml.NVMLError_Timeout:
            return _Event.NONE
        except pynvml.NVMLError as exc:
            log.warning("waiting for NVML events failed: %s", exc)
            return _Event.FAILED
        if not int(data.eventType) & _XID_EVENT:
            return _Event.IGNORED
        code = int(data.eventData)
        index = self._index_of(data.device)
        where = f"GPU {index}" if index is not None else "a GPU"
        if code in self._ignored_xids:
            log.info("%s reported application XID %d; not a device fault", where, code)
            return _Event.IGNORED
        uuid = self._uuid_of(index, data.device)
        if not uuid:
            log.warning("%s reported %s but cannot be identified", where, xid.describe(code))
            return _Event.HEALTH
        self._xid_reasons[uuid] = xid.describe(code)
        self._xid_at[uuid] = time.monotonic()
        log.warning("%s (%s) reported %s; marking it unhealthy", where, uuid, xid.describe(code))
        return _Event.HEALTH

    def _recover(self) -> None:
        """Clears the XIDs of devices that have reported none for `xid_recovery_seconds`."""
        if self._xid_recovery_seconds <= 0:
            return
        now = time.monotonic()
        for uuid, at in list(self._xid_at.items()):
            if now - at >= self._xid_recovery_seconds:
                log.warning(
                    "%s reported no critical XID for %.0fs since %s; healthy again",
                    uuid,
                    self._xid_recovery_seconds,
                    self._xid_reasons.get(uuid, "an XID"),
                )
                self._xid_reasons.pop(uuid, None)
                del self._xid_at[uuid]

    def _index_of(self, handle: Any) -> int | None:
        index = self._index_by_handle.get(_address(handle))
        if index is not None:
            return index
        try:
            return int(pynvml.nvmlDeviceGetIndex(handle))
        except pynvml.NVMLError:
            return None

    def _uuid_of(self, index: int | None, handle: Any) -> GpuUuid | None:
        if index is not None and index in self._last:
            return self._last[index].uuid
        try:
            return GpuUuid(_text(pynvml.nvmlDeviceGetUUID(handle)))
        except pynvml.NVMLError:
            return None

    def _require_open(self) -> None:
        if not self._open:
            raise ProbeError("the NVML probe is closed")
