"""A served map rebuilt from the stored model, for a source that is invalid when the controller
starts: the last valid text is gone with the previous process, the compiled model is not.

The rebuilt map declares what the model served: the resolved node, the devices as the map wrote
them (`declared`), `count` entries as counts (the compiler keeps their earlier picks), MIG entries
as their request (the compiler keeps the instance), with their spares, tolerations and the map's
`sameClique`. A `require` of a `count` entry is not in the model; the kept devices satisfied it when
they were picked.
"""

from __future__ import annotations

from placement.maps import DeclaredSlot, PlacementMap
from placement.model import CompiledMap, CompiledSlot
from placement.types import DeviceRef


def declared_slot(slot: CompiledSlot, cmap: CompiledMap | None = None) -> DeclaredSlot:
    tolerations = cmap.tolerations.get(slot.index, ()) if cmap is not None else ()
    if slot.mig is not None:
        return DeclaredSlot(slot.index, slot.node, mig=slot.mig.request, tolerations=tolerations)
    declared = slot.declared
    if declared.count is not None:
        return DeclaredSlot(slot.index, slot.node, count=declared.count, tolerations=tolerations)
    devices: tuple[DeviceRef, ...] = declared.refs
    if not devices:  # a model written before `declared` was kept: what it resolved
        devices = tuple(slot.devices) or tuple(slot.device_indices)
    fallback = cmap.fallback.get(slot.index, ()) if cmap is not None else ()
    return DeclaredSlot(slot.index, slot.node, devices, tolerations=tolerations, fallback=fallback)


def declared_map(cmap: CompiledMap) -> PlacementMap:
    return PlacementMap(
        key=cmap.key,
        slots=tuple(declared_slot(cmap.slots[i], cmap) for i in cmap.sorted_indices),
        sharing=cmap.sharing,
        indexing=cmap.indexing,
        env_mode=cmap.env_mode,
        rollout=cmap.rollout,
        legacy_sharing=cmap.legacy_sharing,
        source=f"stored model of {cmap.key}",
        same_clique=cmap.same_clique,
        ranks=cmap.ranks,
        gang=cmap.gang,
    )
