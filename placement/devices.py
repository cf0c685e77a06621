"""How a slot names its GPUs: what the map declared, and the identity the binder holds a GPU by.

Both have a text form for people and for the stored model ("0,1", "GPU-…", "count=2"; a UUID or
"#3"); code works with the fields and renders the text only at the edge.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from placement.types import DeviceRef, GpuUuid

_COUNT = "count="
_INDEX = "#"


class GpuId(str):
    """A GPU as the slot cache holds it: its UUID, or `#<index>` while the node's inventory is
    unknown (a pod bound then is held by NVML index until the inventory names the device)."""

    __slots__ = ()

    @classmethod
    def of_uuid(cls, uuid: str) -> GpuId:
        return str.__new__(cls, uuid)

    @classmethod
    def of_index(cls, index: int) -> GpuId:
        return str.__new__(cls, f"{_INDEX}{index}")

    @classmethod
    def of(cls, ref: DeviceRef) -> GpuId:
        return cls.of_index(ref) if isinstance(ref, int) else cls.of_uuid(ref)

    @property
    def nvml_index(self) -> int | None:
        """The NVML index of a GPU held by index; None for one held by UUID."""
        return int(self[1:]) if self.startswith(_INDEX) else None


def gpu_ids(uuids: tuple[str, ...], indices: tuple[int, ...]) -> tuple[GpuId, ...]:
    """The GPUs of a slot or binding: by UUID when known, else by NVML index."""
    if uuids:
        return tuple(GpuId.of_uuid(u) for u in uuids)
    return tuple(GpuId.of_index(i) for i in indices)


@dataclass(frozen=True, slots=True)
class DeclaredDevices:
    """A slot's devices as its map declared them: NVML indices and UUIDs, or a count to pick."""

    refs: tuple[DeviceRef, ...] = ()
    count: int | None = None

    def __str__(self) -> str:
        if self.count is not None:
            return f"{_COUNT}{self.count}"
        return ",".join(map(str, self.refs))

    @classmethod
    def parse(cls, text: str) -> DeclaredDevices:
        """The stored text form back; lenient, as it reads what an earlier version wrote."""
        return _parse(text)


@lru_cache(maxsize=8192)  # a model of 80,000 slots repeats a few hundred declarations
def _parse(text: str) -> DeclaredDevices:
    text = text.strip()
    if text.startswith(_COUNT):
        count = text.removeprefix(_COUNT)
        return DeclaredDevices(count=int(count)) if count.isdecimal() else DeclaredDevices()
    tokens = (t.strip() for t in text.split(","))
    return DeclaredDevices(tuple(int(t) if t.isdecimal() else GpuUuid(t) for t in tokens if t))


#: A slot that declares nothing (a model written before declarations were kept).
UNDECLARED = DeclaredDevices()
