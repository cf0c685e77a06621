"""A GPU's MIG mode and MIG devices through pynvml.

A GPU or driver without MIG answers NOT_SUPPORTED, NOT_FOUND or (an old library) a missing
function: that reads as "MIG disabled", never as a fault of the GPU. Any other failure is logged
and also reads as no MIG: whether the GPU is healthy is decided by the queries every GPU answers.

The profile name comes from the MIG device's name ("NVIDIA H100 80GB HBM3 MIG 3g.40gb"), which
any user may read; the placement comes from the GPU instance, which drivers show only to
processes allowed to monitor MIG (root or the mig/monitor capability). Without that permission
an instance is still listed, with placement start 0 and size 0.
"""

from __future__ import annotations

import logging
from typing import Any

import pynvml

from placement.inventory import MigInstance

log = logging.getLogger(__name__)

MIB = 1024 * 1024

#: What a GPU or driver without MIG answers.
NOT_AVAILABLE: tuple[type[pynvml.NVMLError], ...] = (
    pynvml.NVMLError_NotSupported,
    pynvml.NVMLError_NotFound,
    pynvml.NVMLError_FunctionNotFound,
)
_PROFILE_MARK = " MIG "


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def read_mig(handle: Any, index: int) -> tuple[bool, tuple[MigInstance, ...]]:
    """The GPU's current MIG mode and the MIG devices that exist on it now."""
    try:
        current, _pending = pynvml.nvmlDeviceGetMigMode(handle)
    except NOT_AVAILABLE:
        return False, ()
    except pynvml.NVMLError as exc:
        log.warning("GPU %d cannot report its MIG mode (%s); reporting MIG disabled", index, exc)
        return False, ()
    if int(current) != pynvml.NVML_DEVICE_MIG_ENABLE:
        return False, ()
    try:
        slots = int(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle))
    except pynvml.NVMLError as exc:
        log.warning("GPU %d is in MIG mode but cannot count its MIG devices: %s", index, exc)
        return True, ()
    instances = (_instance(handle, index, slot) for slot in range(slots))
    return True, tuple(i for i in instances if i is not None)


def _instance(parent: Any, index: int, slot: int) -> MigInstance | None:
    try:
        mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, slot)
    except (pynvml.NVMLError_NotFound, pynvml.NVMLError_InvalidArgument):
        return None  # no MIG device at this index: the usual case for most indices
    except pynvml.NVMLError as exc:
        log.warning("GPU %d: MIG device %d cannot be opened: %s", index, slot, exc)
        return None
    try:
        uuid = _text(pynvml.nvmlDeviceGetUUID(mig))
        memory_mib = int(pynvml.nvmlDeviceGetMemoryInfo(mig).total) // MIB
    except pynvml.NVMLError as exc:
        log.warning("GPU %d: MIG device %d cannot be queried: %s", index, slot, exc)
        return None
    start, size, profile_id = _placement(parent, mig, index, slot)
    profile = _profile_from_name(mig) or _profile_from_info(parent, profile_id)
    if not profile:
        log.warning("GPU %d: MIG device %d (%s) names no profile", index, slot, uuid)
    return MigInstance(uuid, profile, slot, start, size, memory_mib)


def _placement(parent: Any, mig: Any, index: int, slot: int) -> tuple[int, int, int | None]:
    """(start, size, GPU instance profile ID); (0, 0, None) where the driver does not say."""
    try:
        gi = pynvml.nvmlDeviceGetGpuInstanceById(parent, pynvml.nvmlDeviceGetGpuInstanceId(mig))
        info = pynvml.nvmlGpuInstanceGetInfo(gi)
    except pynvml.NVMLError as exc:
        log.debug("GPU %d: MIG device %d's placement is not readable: %s", index, slot, exc)
        return 0, 0, None
    return int(info.placement.start), int(info.placement.size), int(info.profileId)


def _profile_from_name(mig: Any) -> str:
    try:
        name = _text(pynvml.nvmlDeviceGetName(mig))
    except pynvml.NVMLError:
        return ""
    _, mark, profile = name.rpartition(_PROFILE_MARK)
    return profile.strip() if mark else ""


def _profile_from_info(parent: Any, profile_id: int | None) -> str:
    # nvidia-ml-py releases before the driver's ...ByIdV entry point lack the binding.
    by_id = getattr(pynvml, "nvmlDeviceGetGpuInstanceProfileInfoById", None)
    if profile_id is None or by_id is None:
        return ""
    try:
        info = by_id(parent, profile_id)
    except pynvml.NVMLError:
        return ""
    return _text(info.name).removeprefix("MIG ").strip()
