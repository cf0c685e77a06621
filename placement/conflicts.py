"""Cross-map checks on declared maps, before any inventory is known (`gpuplace validate`).

Two maps conflict when an exclusive slot of one and any slot of the other name the same device on
the same node, spelled the same way (`node: gpu-a-01`, `devices: [0]`). The compiler finds the rest
(an index in one map and the UUID of that GPU in another, `count` picks) once inventories are in.
Shared maps may overlap one another. Duplicates inside one map are `validate.cross_entry_checks`'s.
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
        return Diagnostic(
            Location(loc.source, loc.line, loc.column, loc.path),
            f"device {self.device} on node {self.node} of {self.second.describe()} is also "
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
            for device in slot.devices:
                earlier = claims[(slot.node, device)]
                for other in earlier:
                    if other.map == pmap.key:
                        continue
                    if Sharing.EXCLUSIVE in (other.sharing, pmap.sharing):
                        conflicts.append(Conflict(slot.node, device, other, claimant))
                        # One message per device and slot: name the first rival only.
                        break
                earlier.append(claimant)
    return conflicts


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
