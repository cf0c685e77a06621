"""Compiling one map's slots: the devices each entry names or picks, checked against its node.

`SlotCompiler` is the per-slot half of `placement.compile.Compiler`, which holds the state these
methods read (the valid maps, the claims index, the model in service and the grants) and runs them
in its passes over the changed maps.
"""

from __future__ import annotations

from dataclasses import replace

from placement.annotations import CLIQUE_LABEL
from placement.compileinputs import CompileInputs
from placement.devices import DeclaredDevices, GpuId, gpu_ids
from placement.gate import judge_slot
from placement.grants import GrantView
from placement.inventory import GpuDevice, NodeInventory, untolerated_taints
from placement.maps import DeclaredSlot, PlacementMap
from placement.model import CompiledSlot, Model
from placement.reasons import Reason
from placement.slotdevices import (
    all_joined,
    mig_slot,
    no_inventory_to_pick,
    picked,
    resolve_mig,
    resolve_named,
)
from placement.types import MapKey, NodeName, Sharing, SlotKey

#: A claimed GPU: (node, its UUID) when resolved, (node, its NVML index) while the inventory is unknown.
Claim = tuple[str, GpuId]


class SlotCompiler:
    """Resolves and checks slots for `Compiler` (see placement/compile.py), which owns and fills
    the state declared here."""

    inputs: CompileInputs
    _maps: dict[MapKey, PlacementMap]
    _model: Model
    _grants: GrantView
    _base: dict[MapKey, dict[int, CompiledSlot]]
    _claims: dict[Claim, set[SlotKey]]

    def resolve_node(self, declared: str) -> tuple[NodeName | None, str]:
        """The node a map means by `declared` (see `placement.nodes`). Returns (node, problem)."""
        return self.inputs.resolve_node(declared)

    def _is_pick(self, slot_key: SlotKey) -> bool:
        """Whether the slot's devices were chosen for a `count` entry (not named by it)."""
        compiled = self._base.get(slot_key.map, {}).get(slot_key.index)
        return compiled is not None and compiled.declared.count is not None

    def _named_elsewhere(self, claim: Claim, me: SlotKey) -> bool:
        """Whether an entry other than `me` names this GPU explicitly (index or UUID)."""
        return any(h != me and not self._is_pick(h) for h in self._claims.get(claim, ()))

    def _compile_slot(
        self, work: MapWork, slot: DeclaredSlot, touched: set[Claim], *, pick: bool
    ) -> bool:
        """Resolves one slot and records its claims; a `count` slot with `pick=False` is only
        resolved if it keeps its previous devices (returns False otherwise)."""
        pmap = work.pmap
        node, problem = self.resolve_node(slot.node)
        target = node or NodeName(slot.node)
        if pmap.same_clique and node is not None and self._off_clique(work, slot, node):
            return True
        inventory = self.inputs.inventories.get(target) if node else None
        if (slot.count is not None or slot.mig is not None) and not pick:
            keep = self._keep_count if slot.count is not None else self._keep_mig
            compiled = keep(pmap, slot, target, inventory)
            if compiled is None:
                return False
            slot_problems: list[str] = []
        else:
            compiled, slot_problems = self._resolve_devices(pmap, slot, target, inventory)
        if problem:
            work.problems.append(f"index {slot.index}: {problem}")
        work.problems.extend(slot_problems)
        if node is not None and not compiled.blocked:
            refused = judge_slot(self._grants, pmap.key.namespace, compiled, inventory, slot.node)
            if refused is not None:
                # Judged on the node and GPUs it compiled to: it claims nothing, holds nothing.
                message = f"index {slot.index}: {refused}"
                work.problems.append(message)
                work.base[slot.index] = replace(
                    compiled, blocked=Reason.NOT_GRANTED, message=message
                )
                return True
        work.base[slot.index] = compiled
        slot_key = SlotKey(pmap.key, slot.index)
        claims = self._claims
        for claim in claims_of(compiled, target):
            work.claims.append((claim, slot_key))
            holders = claims.get(claim)
            if holders is None:
                claims[claim] = {slot_key}
            else:
                holders.add(slot_key)
                # Only a claim held twice can start a contest; build() revisits the rest anyway
                # when their holders are removed.
                touched.add(claim)
        return True

    def _keep_count(
        self,
        pmap: PlacementMap,
        slot: DeclaredSlot,
        node: NodeName,
        inventory: NodeInventory | None,
    ) -> CompiledSlot | None:
        """The devices this `count` entry was given in the model in service, if they are still
        present, healthy, untainted and matching, and no other entry names them. Other picks of
        the same GPU do not matter here: the entry is their incumbent and keeps it, as any slot
        would."""
        previous = self._model.slot(pmap.key, slot.index)
        if (
            inventory is None
            or previous is None
            or previous.blocked
            or previous.node != node
            or previous.declared.count != slot.count
            or len(previous.devices) != slot.count
        ):
            return None
        kept: list[GpuDevice] = []
        me = SlotKey(pmap.key, slot.index)
        for uuid in previous.devices:
            device = inventory.by_uuid.get(uuid)
            if (
                device is None
                or not device.healthy
                or not device.satisfies(slot.require)
                or device.blocked_by(slot.tolerations)
            ):
                return None
            if self._named_elsewhere((node, GpuId.of_uuid(uuid)), me) or self._named_elsewhere(
                (node, GpuId.of_index(device.index)), me
            ):
                return None
            kept.append(device)
        if slot.require is not None and slot.require.nvlink and not all_joined(kept):
            return None  # a link went down: pick again among sets still joined
        return CompiledSlot(
            slot.index,
            node,
            tuple(d.uuid for d in kept),
            tuple(d.index for d in kept),
            DeclaredDevices(count=slot.count),
        )

    def _keep_mig(
        self,
        pmap: PlacementMap,
        slot: DeclaredSlot,
        node: NodeName,
        inventory: NodeInventory | None,
    ) -> CompiledSlot | None:
        """The MIG instance this entry was given in the model in service, if it still exists on
        the same parent with the same profile, no other slot holds it and no DRA taint the slot
        does not tolerate keeps it."""
        previous = self._model.slot(pmap.key, slot.index)
        if (
            inventory is None
            or previous is None
            or previous.blocked
            or previous.node != node
            or previous.mig is None
            or previous.mig.request != slot.mig
            or len(previous.devices) != 1
        ):
            return None
        uuid = previous.devices[0]
        instance = inventory.mig_by_uuid.get(uuid)
        parent = inventory.mig_parent.get(uuid)
        if (
            instance is None
            or parent is None
            or parent is not inventory.find(previous.mig.request.gpu)
            or not parent.mig_mode
            or instance.profile != previous.mig.request.profile
            or untolerated_taints(instance.taints, slot.tolerations)
            or self._held_by_other((node, GpuId.of_uuid(uuid)), SlotKey(pmap.key, slot.index))
        ):
            return None
        compiled, _ = mig_slot(slot, node, parent, instance)
        return compiled

    def _held_by_other(self, claim: Claim, me: SlotKey) -> bool:
        return any(h != me for h in self._claims.get(claim, ()))

    def _resolve_devices(
        self,
        pmap: PlacementMap,
        slot: DeclaredSlot,
        node: NodeName,
        inventory: NodeInventory | None,
    ) -> tuple[CompiledSlot, list[str]]:
        if slot.mig is not None:
            me = SlotKey(pmap.key, slot.index)
            return resolve_mig(
                slot,
                node,
                inventory,
                lambda uuid: self._held_by_other((node, GpuId.of_uuid(uuid)), me),
            )
        if slot.count is None:
            if not slot.fallback or inventory is None:
                return resolve_named(slot, node, inventory)
            me = SlotKey(pmap.key, slot.index)
            return resolve_named(slot, node, inventory, lambda d: self._free(pmap, me, node, d))
        if inventory is None:
            return no_inventory_to_pick(slot, node)
        return self._resolve_count(pmap, slot, node, inventory)

    def _resolve_count(
        self, pmap: PlacementMap, slot: DeclaredSlot, node: NodeName, inventory: NodeInventory
    ) -> tuple[CompiledSlot, list[str]]:
        me = SlotKey(pmap.key, slot.index)

        def free(device: GpuDevice) -> bool:
            return self._free(pmap, me, node, device)

        # A GPU in MIG mode serves its instances (`mig` entries), never a whole-GPU pick.
        usable = [
            d
            for d in inventory.devices
            if d.healthy
            and not d.mig_mode
            and d.satisfies(slot.require)
            and not d.blocked_by(slot.tolerations)
        ]
        return picked(slot, node, usable, [d for d in usable if free(d)])

    def _free(self, pmap: PlacementMap, me: SlotKey, node: NodeName, device: GpuDevice) -> bool:
        """Whether `me` may take `device` (a pick or a spare): nobody else holds it, or all its
        holders and `me` are shared maps."""
        holders = self._claims.get((node, GpuId.of_uuid(device.uuid)))
        if not holders or (len(holders) == 1 and me in holders):
            return True
        if pmap.sharing is Sharing.EXCLUSIVE:
            return False
        return all(
            self._maps[h.map].sharing is Sharing.SHARED
            for h in holders
            if h != me and h.map in self._maps
        )

    def _map_clique(self, pmap: PlacementMap) -> str | None:
        """The GPU clique a `sameClique` map's slots go to: the one most of their nodes are in
        (a tie goes to the lowest index's); None when no node of theirs carries one."""
        cliques = self.inputs.cliques
        seen: list[str] = []
        for slot in pmap.slots:
            node, _ = self.resolve_node(slot.node)
            clique = cliques.get(node) if node is not None else None
            if clique is not None:
                seen.append(clique)
        if not seen:
            return None
        return max(dict.fromkeys(seen), key=seen.count)

    def _off_clique(self, work: MapWork, slot: DeclaredSlot, node: NodeName) -> bool:
        """Blocks the slot of a `sameClique` map (no claims) if its node is not in the map's
        clique; whether it did."""
        clique = self.inputs.cliques.get(node)
        if clique is not None and clique == work.clique:
            return False
        where = f"index {slot.index} on node {node}"
        if clique is None:
            message = f"{where}: sameClique: node {node} has no {CLIQUE_LABEL} label"
        else:
            message = (
                f"{where}: sameClique: node {node} is in GPU clique {clique!r}, the map's "
                f"other slots in {work.clique!r} ({CLIQUE_LABEL})"
            )
        declared = DeclaredDevices(slot.devices, slot.count)
        work.base[slot.index] = CompiledSlot(
            slot.index, node, declared=declared, blocked=Reason.CLIQUE_MISMATCH, message=message
        )
        work.problems.append(message)
        return True


class MapWork:
    """What compiling one map produces, filled slot by slot."""

    __slots__ = ("base", "claims", "clique", "pmap", "problems")

    def __init__(self, pmap: PlacementMap) -> None:
        self.pmap = pmap
        self.base: dict[int, CompiledSlot] = {}
        self.problems: list[str] = []
        self.claims: list[tuple[Claim, SlotKey]] = []
        self.clique: str | None = None  # the GPU clique of a `sameClique` map


def claims_of(slot: CompiledSlot, node: NodeName) -> list[Claim]:
    claims: list[Claim] = [(node, gpu) for gpu in gpu_ids(slot.devices, slot.device_indices)]
    if slot.mig is not None and slot.mig.parent and slot.devices:
        # The instance, and its parent GPU: a whole-GPU slot of that GPU contests it.
        claims.append((node, GpuId.of_uuid(slot.mig.parent)))
    return claims
