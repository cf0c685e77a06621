"""Compilation of valid maps into the served model, incrementally.

The compiler keeps what it resolved per map, an index from each claimed GPU to the slots that claim
it, and the set of GPUs claimed more than once. A change to one map, node or inventory recompiles the
maps it touches and re-decides only the contested GPUs, so a one-map update costs that map's size,
not the cluster's.

Invariants:
- a GPU claimed by an exclusive slot and any other slot is served to at most one of them: the slot
  that held it in the previous model (the incumbent), otherwise to none; lines of one legacy map
  that name the same GPU count as one claimant (they share it, see placement.legacy);
- a `count` entry keeps the devices it was given while they stay present, healthy and matching,
  and no other entry names them: a pick yields to a named claim and is made again around it (a pod
  still running on the old pick keeps its GPU; the binder places the named slot's pod once it is
  free).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from placement.annotations import LEGACY_NODE_LABEL
from placement.bulk import without_cycle_collection
from placement.compileinputs import CompileInputs
from placement.devices import GpuId, gpu_ids
from placement.grants import GrantView, granted_map
from placement.inventory import NodeInventory
from placement.maps import DeclaredSlot, PlacementMap
from placement.model import CompiledMap, CompiledSlot, Model, Provenance
from placement.reasons import Reason
from placement.slotcompile import Claim, MapWork, SlotCompiler
from placement.status import Phase
from placement.types import MapKey, NodeName, Sharing, SlotKey


@dataclass(frozen=True, slots=True)
class MapReport:
    key: MapKey
    phase: Phase
    message: str = ""
    problems: tuple[str, ...] = ()
    conflicts_with: tuple[MapKey, ...] = ()
    total: int = 0
    served: int = 0


class Compiler(SlotCompiler):
    def __init__(self, alias_label: str = LEGACY_NODE_LABEL, previous: Model | None = None) -> None:
        """`previous` is the model in service (e.g. read back after a restart): its generation
        continues, its slots stay incumbents in conflicts and its `count` choices are kept. Maps of
        it that are not set before the first build are dropped from the model."""
        self.alias_label = alias_label
        self.inputs = CompileInputs(alias_label)
        self._maps = self.inputs.maps  # the valid maps, read on every slot
        self._base: dict[MapKey, dict[int, CompiledSlot]] = {}
        self._problems: dict[MapKey, list[str]] = {}
        self._claims: dict[Claim, set[SlotKey]] = defaultdict(set)
        self._slot_claims: dict[MapKey, list[tuple[Claim, SlotKey]]] = {}
        self._contested: set[Claim] = set()
        self._reports: dict[MapKey, MapReport] = {}
        self._in_conflict: set[MapKey] = set()  # maps with a contested slot in the last build
        self._model = previous if previous is not None else Model()
        self._grants = self._model.grants
        # The model's maps as a plain dict, updated in place: copying a 10,000-map mapping
        # proxy on every build would rehash every key.
        self._served: dict[MapKey, CompiledMap] = dict(self._model.maps)
        self.inputs.dirty |= set(self._model.maps)

    # -- inputs (`CompileInputs`) -------------------------------------------------------------
    def set_map(
        self, pmap: PlacementMap, source_version: str = "", provenance: Provenance | None = None
    ) -> None:
        self.inputs.set_map(pmap, source_version, provenance)

    def remove_map(self, key: MapKey) -> None:
        self.inputs.remove_map(key)

    def set_grants(self, grants: GrantView) -> None:
        """The grants the next model carries; every slot is judged by them again (a slot whose
        pods would hold a node or GPU they do not grant is blocked: `placement.gate`), and keeps
        only the tolerations the grants let it hold."""
        if grants != self._grants:
            self.inputs.dirty |= set(self._maps)
        self._grants = grants

    def set_node(self, name: NodeName, labels: Mapping[str, str]) -> bool:
        """Whether the node's labels change what a map compiles to (its alias, its GPU clique)."""
        return self.inputs.set_node(name, labels)

    def remove_node(self, name: NodeName) -> None:
        self.inputs.remove_node(name)

    def aliases(self) -> dict[str, frozenset[NodeName]]:
        return self.inputs.aliases()

    def set_inventory(self, inventory: NodeInventory) -> None:
        self.inputs.set_inventory(inventory)

    def remove_inventory(self, node: NodeName) -> None:
        self.inputs.remove_inventory(node)

    def seed(self, model: Model) -> None:
        """Continues from a stored model (after a restart or failover): its generation, its `count`
        choices and its incumbents carry over; maps it has that no source has are dropped."""
        self._model = model
        self.inputs.dirty |= set(model.maps)

    @property
    def model(self) -> Model:
        return self._model

    @property
    def reports(self) -> Mapping[MapKey, MapReport]:
        return self._reports

    # -- compilation --------------------------------------------------------------------------
    def build(self) -> tuple[Model, Mapping[MapKey, MapReport]]:
        """Recompiles what changed; returns the model (generation bumped if content changed)."""
        with without_cycle_collection():
            return self._build()

    def _build(self) -> tuple[Model, Mapping[MapKey, MapReport]]:
        dirty = self.inputs.dirty
        self.inputs.dirty = set()
        touched_claims: set[Claim] = set()
        self._recompile(dirty, touched_claims)
        # A `count` pick yields to an entry that names the same GPU: maps whose picks are now named
        # elsewhere pick again, around every claim. Each map re-picks at most once per build.
        repick = self._yielding_picks(touched_claims) - dirty
        while repick:
            dirty |= repick
            self._recompile(repick, touched_claims)
            repick = self._yielding_picks(touched_claims) - dirty
        self._update_contested(touched_claims)
        losers, contenders = self._decide_contests()
        # Per map: index -> rival slots, and the indices that lose their GPU.
        rivals: dict[MapKey, dict[int, set[SlotKey]]] = defaultdict(dict)
        for slot_key, others in contenders.items():
            rivals[slot_key.map][slot_key.index] = others
        lost: dict[MapKey, set[int]] = defaultdict(set)
        for slot_key in losers:
            lost[slot_key.map].add(slot_key.index)
        # Maps in a conflict before or now: a change elsewhere may have started or ended it.
        affected = set(dirty) | set(rivals) | self._in_conflict
        self._in_conflict = set(rivals)
        generation = self._model.generation + 1
        changed = self._serve(affected, lost, rivals, generation)
        if changed or self._grants != self._model.grants:
            self._model = Model(generation, self._served, self._grants)
        return self._model, self._reports

    def _update_contested(self, claims: set[Claim]) -> None:
        """GPUs named by more than one slot are contested; unnamed ones are forgotten."""
        for claim in claims:
            holders = self._claims.get(claim)
            if holders is not None and len(holders) > 1:
                self._contested.add(claim)
            else:
                self._contested.discard(claim)
                if holders is not None and not holders:
                    del self._claims[claim]

    def _serve(
        self,
        affected: set[MapKey],
        lost: Mapping[MapKey, set[int]],
        rivals: Mapping[MapKey, dict[int, set[SlotKey]]],
        generation: int,
    ) -> bool:
        """Reassembles the served version of each affected map; whether any of them changed."""
        maps = self._served
        changed = False
        for key in affected:
            if key not in self._maps:
                if maps.pop(key, None) is not None:
                    changed = True
                self._reports.pop(key, None)
                continue
            cmap = assemble(
                granted_map(self._grants, self._maps[key]),
                self._base[key],
                lost.get(key, set()),
                rivals.get(key, {}),
                generation,
                self.inputs.versions.get(key, ""),
                self.inputs.provenance.get(key, Provenance()),
            )
            old = maps.get(key)
            if old is None or not old.content_equal(cmap):
                maps[key] = cmap
                changed = True
            self._reports[key] = map_report(
                key, maps[key], self._problems.get(key, ()), rivals.get(key, {})
            )
        return changed

    def _recompile(self, keys: set[MapKey], touched: set[Claim]) -> None:
        """Drops what `keys` resolved before and compiles them again from their source."""
        for key in sorted(keys):
            for claim, slot_key in self._slot_claims.pop(key, []):
                self._claims[claim].discard(slot_key)
                touched.add(claim)
            self._base.pop(key, None)
            self._problems.pop(key, None)
        self._compile_maps([self._maps[k] for k in sorted(keys) if k in self._maps], touched)

    def _yielding_picks(self, claims: Iterable[Claim]) -> set[MapKey]:
        """Maps holding a `count` pick of a GPU that another entry names."""
        maps: set[MapKey] = set()
        for claim in claims:
            holders = self._claims.get(claim)
            if holders is None or len(holders) < 2:
                continue
            for holder in holders:
                if self._is_pick(holder) and self._named_elsewhere(claim, holder):
                    maps.add(holder.map)
        return maps

    def _compile_maps(self, pmaps: list[PlacementMap], touched: set[Claim]) -> None:
        """Compiles in three passes over all changed maps: explicit devices; then `count` entries
        that keep the devices they were given; then new `count` picks, which choose around every
        claim made so far. So a pick never takes a device that another entry names or holds."""
        pending: list[tuple[MapWork, DeclaredSlot]] = []
        # Entries with spares come after every other named entry: a spare is free only if no
        # entry names it.
        spared: list[tuple[MapWork, DeclaredSlot]] = []
        for declared in pmaps:
            # An ungranted toleration is ignored, never honoured: no taint it names is tolerated.
            pmap = granted_map(self._grants, declared)
            work = MapWork(pmap)
            if pmap.same_clique:
                work.clique = self._map_clique(pmap)
            self._base[pmap.key] = work.base
            self._problems[pmap.key] = work.problems
            self._slot_claims[pmap.key] = work.claims
            for slot in pmap.slots:
                if slot.fallback:
                    spared.append((work, slot))
                elif slot.count is None and slot.mig is None:
                    self._compile_slot(work, slot, touched, pick=False)
                else:
                    pending.append((work, slot))
        for work, slot in spared:
            self._compile_slot(work, slot, touched, pick=False)
        picks = [(w, s) for w, s in pending if not self._compile_slot(w, s, touched, pick=False)]
        for work, slot in picks:
            self._compile_slot(work, slot, touched, pick=True)

    def _decide_contests(self) -> tuple[set[SlotKey], dict[SlotKey, set[SlotKey]]]:
        """The slots that lose a contested GPU, and every contending slot with its rivals."""
        losers: set[SlotKey] = set()
        contenders: dict[SlotKey, set[SlotKey]] = defaultdict(set)
        for claim in self._contested:
            holders = self._claims[claim]
            sharing = [self._maps[h.map].sharing for h in holders if h.map in self._maps]
            if all(s is Sharing.SHARED for s in sharing):
                continue
            if len(self._sharers(next(iter(holders)), holders, claim)) == len(holders):
                continue  # lines of one legacy map, or MIG slots of one GPU, and nobody else
            incumbent = self._incumbent(claim, holders)
            winners = self._sharers(incumbent, holders, claim) if incumbent is not None else set()
            for holder in holders:
                contenders[holder] |= holders - self._sharers(holder, holders, claim)
                if holder not in winners:
                    losers.add(holder)
        return losers, contenders

    def _co_tenants(self, slot: SlotKey, holders: set[SlotKey]) -> set[SlotKey]:
        """`slot` and the holders it shares a GPU with as lines of the same legacy map; whoever
        wins or loses the GPU against anyone else, they win or lose it together."""
        pmap = self._maps.get(slot.map)
        if pmap is None or not pmap.legacy_sharing:
            return {slot}
        return {h for h in holders if h.map == slot.map}

    def _sharers(self, slot: SlotKey, holders: set[SlotKey], claim: Claim) -> set[SlotKey]:
        """`_co_tenants`, and for a GPU that MIG slots claim as their parent: every MIG slot of
        it (each holds its own instance); they win or lose it against a whole-GPU slot together."""
        if self._mig_parent(slot) == claim[1]:
            return {h for h in holders if self._mig_parent(h) == claim[1]}
        return self._co_tenants(slot, holders)

    def _mig_parent(self, slot: SlotKey) -> str | None:
        compiled = self._base.get(slot.map, {}).get(slot.index)
        if compiled is None or compiled.mig is None or not compiled.mig.parent:
            return None
        return compiled.mig.parent

    def _incumbent(self, claim: Claim, holders: set[SlotKey]) -> SlotKey | None:
        node, device = claim
        for holder in sorted(holders):
            slot = self._model.slot(holder.map, holder.index)
            if slot is None or slot.blocked or slot.node != node:
                continue
            held = (
                slot.devices
                if GpuId(device).nvml_index is None
                else gpu_ids((), slot.device_indices)
            )
            if device in held or (slot.mig is not None and slot.mig.parent == device):
                return holder
        return None


def assemble(
    pmap: PlacementMap,
    slots: dict[int, CompiledSlot],
    lost: set[int],
    rivals: Mapping[int, set[SlotKey]],
    generation: int,
    version: str,
    provenance: Provenance,
) -> CompiledMap:
    """The served version of a map: its compiled slots, those that lost a contested GPU blocked
    with the rivals named."""
    if lost:
        slots = dict(slots)
        for index in lost:
            base = slots[index]
            names = ", ".join(str(r) for r in sorted(rivals[index]))
            what = f"MIG {base.mig.request}" if base.mig is not None else f"GPU {base.declared}"
            message = f"{what} on node {base.node} is also claimed by {names}"
            slots[index] = replace(base, blocked=Reason.SLOT_CONFLICT, message=message)
    return CompiledMap(
        pmap.key,
        slots,
        pmap.sharing,
        pmap.indexing,
        pmap.env_mode,
        generation,
        version,
        pmap.legacy_sharing,
        pmap.rollout,
        provenance,
        {s.index: s.tolerations for s in pmap.slots if s.tolerations},
        {s.index: s.fallback for s in pmap.slots if s.fallback},
        pmap.same_clique,
        pmap.ranks,
        pmap.gang,
    )


def map_report(
    key: MapKey,
    cmap: CompiledMap,
    problems: Iterable[str],
    contenders: Mapping[int, set[SlotKey]],
) -> MapReport:
    """What the map's status says of its compile: its phase, message and slot counts."""
    found = tuple(problems)
    rivals: set[MapKey] = set()
    conflict_lines = []
    for index in sorted(contenders):
        for other in sorted(contenders[index]):
            rivals.add(other.map)
            conflict_lines.append(f"index {index} conflicts with {other}")
    blocked = sum(1 for s in cmap.slots.values() if s.blocked)
    total = len(cmap.slots)
    if conflict_lines:
        phase, message = Phase.CONFLICT, "; ".join(conflict_lines)
    elif found:
        phase, message = Phase.DEGRADED, "; ".join(found)
    else:
        phase, message = Phase.VALID, f"{total} slots"
    return MapReport(
        key, phase, message, found, tuple(sorted(rivals - {key})), total, total - blocked
    )
