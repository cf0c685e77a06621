"""Cross-map checks on declared maps, before any inventory is known (`gpuplace validate`).

Two maps conflict when an exclusive slot of one and any slot of the other name the same device
(declared or as a fallback spare) on the same node, spelled the same way (`node: gpu-a-01`, `devices: [0]`). The compiler finds the rest
(an index in one map and the UUID of that GPU in another, `count` picks) once inventories are in.
Shared maps may overlap one another. A `mig` entry claims its parent GPU against whole-GPU entries
only, shared or not: a GPU in MIG mode serves its instances, which the compiler hands out. Duplicates inside one map are `validate.cross_entry_checks`'s.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable
from dataclasses import dataclass

from placement.errors import Diagnostic, Location
from placement.maps import DeclaredSlot, PlacementMap
from placement.types import DeviceRef, MapKey, Sharing

CONFLICT_HINT = "use another device, or set 'sharing: shared' in both maps"


@dataclass(frozen=True, slots=True)
class Claimant:
    """One slot naming a device."""

    map: MapKey
    sharing: Sharing
    slot: DeclaredSlot

    def describe(self) -> str:
        where = self.slot.location
        at = f" ({where})" if where.source else ""
        return f"{self.sharing.value} map {self.map} index {self.slot.index}{at}"


@dataclass(frozen=True, slots=True)
class Conflict:
    """`second` names a device that `first` (earlier in map order) already names."""

    node: str
    device: DeviceRef
    first: Claimant
    second: Claimant

    def diagnostic(self) -> Diagnostic:
        loc = self.second.slot.location
        if self.second.slot.mig is not None or self.first.slot.mig is not None:
            return Diagnostic(
                Location(loc.source, loc.line, loc.column, loc.path),
                f"GPU {self.device} on node {self.node} of {self.second.describe()} is also "
                f"claimed by {self.first.describe()}; a GPU in MIG mode serves its MIG "
                "instances only, never a whole-GPU slot",
                hint="give the whole-GPU slot another GPU, or a MIG instance",
            )
        spare = " (a fallback device)" if self.device in self.second.slot.fallback else ""
        return Diagnostic(
            Location(loc.source, loc.line, loc.column, loc.path),
            f"device {self.device}{spare} on node {self.node} of {self.second.describe()} is also "
            f"claimed by {self.first.describe()}; an exclusive slot needs its GPU to itself",
            hint=CONFLICT_HINT,
        )


def find_conflicts(
    maps: Iterable[PlacementMap], incumbents: Collection[MapKey] = ()
) -> list[Conflict]:
    """Every pair of slots from different maps that claim one device where either is exclusive,
    reported at the later one; deterministic: `incumbents` (maps already in service) first, then
    maps in key order, slots in index order."""
    claims: dict[tuple[str, DeviceRef], list[Claimant]] = defaultdict(list)
    conflicts: list[Conflict] = []
    for pmap in sorted(maps, key=lambda m: (m.key not in incumbents, m.key)):
        for slot in pmap.slots:
            claimant = Claimant(pmap.key, pmap.sharing, slot)
            # A spare (fallback device) counts as claimed: it serves when a declared one fails.
            named = (slot.mig.gpu,) if slot.mig is not None else slot.devices
            for device in (*named, *slot.fallback):
                earlier = claims[(slot.node, device)]
                for other in earlier:
                    if other.map == pmap.key:
                        continue
                    if _clash(other, claimant):
                        conflicts.append(Conflict(slot.node, device, other, claimant))
                        # One message per device and slot: name the first rival only.
                        break
                earlier.append(claimant)
    return conflicts


def _clash(first: Claimant, second: Claimant) -> bool:
    """Whether two slots of different maps that name one GPU may not both have it."""
    if first.slot.mig is not None or second.slot.mig is not None:
        return (first.slot.mig is None) != (second.slot.mig is None)
    return Sharing.EXCLUSIVE in (first.sharing, second.sharing)


def find_duplicate_maps(
    maps: Iterable[tuple[PlacementMap, Location]],
) -> list[Diagnostic]:
    """A map declared twice (same namespace and name) where one ConfigMap can hold only one."""
    first: dict[MapKey, Location] = {}
    out: list[Diagnostic] = []
    for pmap, where in maps:
        seen = first.get(pmap.key)
        if seen is None:
            first[pmap.key] = where
            continue
        out.append(
            Diagnostic(
                where,
                f"map {pmap.key} is declared twice (first at {seen})",
                hint="each map is one ConfigMap: give one of them another metadata.name",
            )
        )
    return out
