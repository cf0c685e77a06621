"""The binder's decision for one pod, as a pure function of the model and the cluster's state.

Expected rejections are not errors: each is a `Status` with a reason that becomes the pod's
PodScheduled condition and Event, plus the keys of the objects whose change may unblock it, so the
binder retries at once when one of them changes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Protocol

from placement.annotations import (
    LEGACY_NODE_LABEL,
    BindingDecision,
    legacy_map_key,
)
from placement.declared import declared_elsewhere
from placement.devices import DeclaredDevices, GpuId
from placement.errors import PlacementError
from placement.gate import Device, identify, judge
from placement.gate import Path as GatePath
from placement.indexing import IndexSource, PodIdentity, resolve_index
from placement.inventory import NodeInventory, device_problems, taint_problem
from placement.legacy import LegacyEntry, pod_line, shared_gpus
from placement.model import CompiledMap, CompiledSlot, Model, Provenance
from placement.nodes import resolve_node
from placement.reasons import Reason
from placement.taints import Toleration
from placement.types import EnvMode, GpuUuid, MapKey, NodeName, Sharing, SlotKey
from placement.wake import WakeKey


class Code(StrEnum):
    SUCCESS = "Success"
    UNSCHEDULABLE = "Unschedulable"  # waits for a change in the cluster
    UNRESOLVABLE = "UnschedulableAndUnresolvable"  # waits for the pod or the map to change


@dataclass(frozen=True, slots=True)
class Status:
    code: Code
    reason: Reason
    message: str
    #: What may unblock it (see `placement.wake` for every kind of key).
    waits_for: frozenset[WakeKey] = field(default_factory=frozenset)
    #: Pods whose decisions end in the same non-empty cohort are interchangeable (pods of one
    #: `indexing: allocate` map that hold no slot): one of them is decided again per change.
    cohort: str = ""
    #: Free slots this decision found it cannot serve now, each with why (see `Placement`).
    unservable: tuple[tuple[int, Status], ...] = ()


@dataclass(frozen=True, slots=True)
class NodeState:
    name: NodeName
    ready: bool = True
    schedulable: bool = True
    alias: str | None = None


@dataclass(frozen=True, slots=True)
class InventoryState:
    inventory: NodeInventory
    fresh: bool = True


@dataclass(frozen=True, slots=True)
class PodFacts:
    namespace: str
    name: str
    uid: str
    labels: Mapping[str, str]
    owner_kind: str | None = None
    map_name: str | None = None  # label gpuplace.io/map
    legacy_map: str | None = None  # annotation gpu-scheduling-map
    generated_name: bool = False  # metadata.name came from metadata.generateName
    #: The pod's annotations that rank resolution reads (`placement.indexing.RANK_ANNOTATIONS`).
    rank_annotations: Mapping[str, str] = field(default_factory=dict)
    #: Why a map's pod was not admitted by the webhook (`placement.admitted`); "" when it was.
    not_admitted: str = ""
    #: Why the pod's own gpu-scheduling-map line is not read (its namespace is outside the legacy
    #: namespace selector); "" when it is, or when it has none.
    legacy_refused: str = ""


class Held(Protocol):
    """One pod's holding, as far as a decision needs it."""

    @property
    def pod(self) -> str: ...  # namespace/name

    @property
    def slot(self) -> SlotKey: ...


class FreeSlots(Protocol):
    """One map's free slots, indexed: declared, not blocked, held by no pod, and not parked (a
    slot an earlier decision could not serve waits, parked, for what its refusal named)."""

    def next_free(self, after: int, limit: int) -> Sequence[int]: ...  # the lowest above `after`

    def parked(self, limit: int) -> tuple[int, tuple[Status, ...]]: ...  # count, first refusals


class SlotView(Protocol):
    """What the binder's cache knows: which pod holds a slot, which pods use a GPU, which slots
    of a map are free."""

    def slot_holder(self, slot: SlotKey) -> str | None: ...

    def holding(self, uid: str) -> Held | None: ...

    def gpu_holders(self, node: NodeName, gpu: str) -> Mapping[str, Sharing]: ...

    def free_slots(self, cmap: CompiledMap) -> FreeSlots: ...


@dataclass(frozen=True, slots=True)
class Placement:
    slot: SlotKey
    decision: BindingDecision
    sharing: Sharing
    gpus: tuple[GpuId, ...]  # the GPUs this pod will hold
    #: Free slots below this one that an allocation found it cannot serve now, each with why:
    #: the binder parks them (controller/freeslots.py) until what they wait for changes.
    unservable: tuple[tuple[int, Status], ...] = ()


@dataclass(frozen=True, slots=True)
class Cluster:
    model: Model
    nodes: Mapping[NodeName, NodeState]
    aliases: Mapping[str, frozenset[NodeName]]
    inventories: Mapping[NodeName, InventoryState]
    require_inventory: bool = True
    alias_label: str = LEGACY_NODE_LABEL


#: Whether the holder of a slot may use a GPU together with the pod being placed.
MayShare = Callable[[SlotKey, str], bool]


def _never(_held: SlotKey, _gpu: str) -> bool:
    return False


def _who(slots: SlotView, uid: str) -> str:
    """A holder as people know it: pod namespace/name, the uid as a detail."""
    held = slots.holding(uid)
    return f"pod {held.pod} (uid {uid})" if held is not None else f"pod uid {uid}"


def _wait(reason: Reason, message: str, *keys: WakeKey) -> Status:
    return Status(Code.UNSCHEDULABLE, reason, message, frozenset(keys))


def _slot_taken(
    pod: PodFacts, slots: SlotView, slot: SlotKey, what: str, *also: WakeKey
) -> Status | None:
    """SlotTaken while another pod holds `slot` (woken when it frees, or by `also`); None when
    it is free or this pod's."""
    holder = slots.slot_holder(slot)
    if holder is None or holder == pod.uid:
        return None
    return _wait(
        Reason.SLOT_TAKEN, f"{what} is held by {_who(slots, holder)}", WakeKey.slot(slot), *also
    )


def _fail(reason: Reason, message: str) -> Status:
    return Status(Code.UNRESOLVABLE, reason, message, frozenset({WakeKey.model()}))


def plan(pod: PodFacts, cluster: Cluster, slots: SlotView) -> Placement | Status:
    if pod.map_name is not None:
        return _plan_map_pod(pod, cluster, slots)
    if pod.legacy_map is not None:
        return _plan_legacy_pod(pod, cluster, slots)
    if pod.legacy_refused:
        return _fail(Reason.NOT_GRANTED, pod.legacy_refused)
    return _fail(
        Reason.NO_PLACEMENT,
        "pod has neither label gpuplace.io/map nor annotation gpu-scheduling-map",
    )


def _plan_map_pod(pod: PodFacts, cluster: Cluster, slots: SlotView) -> Placement | Status:
    assert pod.map_name is not None
    if pod.not_admitted:
        # Nothing the pod waits for can change: its containers are immutable.
        return Status(Code.UNRESOLVABLE, Reason.NOT_ADMITTED, pod.not_admitted, frozenset())
    key = MapKey(pod.namespace, pod.map_name)
    cmap = cluster.model.maps.get(key)
    if cmap is None:
        return _wait(
            Reason.MAP_NOT_FOUND, f"placement map {key} is not in the model", WakeKey.model()
        )
    identity = PodIdentity(
        pod.name, pod.labels, pod.owner_kind, pod.generated_name, pod.rank_annotations
    )
    choice = resolve_index(identity, cmap.indexing, cmap.ranks)
    if choice.error:
        return _fail(Reason.INDEX_INVALID, f"map {key}: {choice.error}")
    if choice.source is IndexSource.ALLOCATE:
        held = slots.holding(pod.uid)
        if held is None or held.slot.map != key or slots.slot_holder(held.slot) != pod.uid:
            return _allocate(pod, cmap, cluster, slots)
        index: int | None = held.slot.index
    else:
        index = choice.index
    assert index is not None
    slot = cmap.slots.get(index)
    if slot is None:
        return _wait(
            Reason.INDEX_NOT_IN_MAP,
            f"map {key} has no index {index} ({choice.source.value})",
            WakeKey.model(),
        )
    taken = _slot_taken(
        pod, slots, SlotKey(key, index), f"map {key} index {index}", WakeKey.model()
    )
    if taken is not None:
        return taken
    if slot.blocked:
        return _wait(slot.blocked, f"map {key} index {index}: {slot.message}", WakeKey.model())
    return _place_in_map(pod, cmap, index, cluster, slots)


def _place_in_map(
    pod: PodFacts, cmap: CompiledMap, index: int, cluster: Cluster, slots: SlotView
) -> Placement | Status:
    def lines_share(held: SlotKey, gpu: str) -> bool:
        return held.map == cmap.key and cmap.lines_share(index, held.index, gpu)

    return _check_and_place(
        pod,
        SlotKey(cmap.key, index),
        cmap.slots[index],
        cmap.env_mode,
        cmap.sharing,
        cmap.generation,
        cluster,
        slots,
        lines_share if cmap.legacy_sharing else _never,
        cmap.provenance,
        cluster.model.tolerations(cmap.key, index),
    )


#: Refusals that hold for every slot of the node (`_node_refusal`, and `_device_refusal` for
#: the node's inventory): an allocation checks each such node once.
_NODE_WIDE = frozenset(
    {
        Reason.NODE_NOT_FOUND,
        Reason.NODE_NOT_READY,
        Reason.NODE_CORDONED,
        Reason.INVENTORY_MISSING,
        Reason.INVENTORY_STALE,
    }
)

#: The most free slots an allocation reads from the index at a time.
_MAX_BATCH = 512


def _allocate(
    pod: PodFacts, cmap: CompiledMap, cluster: Cluster, slots: SlotView
) -> Placement | Status:
    """The lowest free slot that can be served now: its node Ready and schedulable, its devices
    present, healthy and not in use. A cordoned node or a sick GPU under the lowest free slot
    does not keep the pod waiting while a higher one is servable. The free slots come from the
    cache's index in ascending order, each found by a binary search, and checks stop at the
    first servable one, so a healthy map costs one check whatever its size; a slot found
    unservable is reported (`unservable`) for the cache to park, so the next decisions skip it
    until what it waits for changes."""
    key = cmap.key
    free = slots.free_slots(cmap)
    cohort = f"allocate:{key}"
    refused: list[tuple[int, Status]] = []
    node_refused: dict[NodeName, Status] = {}
    batch = 1  # the lowest free slot is servable in a healthy map: read more only when not
    found = free.next_free(-1, batch)
    while found:
        for index in found:
            node = cmap.slots[index].node
            outcome = node_refused.get(node) or _place_in_map(pod, cmap, index, cluster, slots)
            if isinstance(outcome, Placement):
                return replace(outcome, unservable=tuple(refused))
            if outcome.reason in _NODE_WIDE:
                node_refused[node] = outcome  # the node's other slots: the same refusal
            refused.append((index, outcome))
        batch = min(batch * 8, _MAX_BATCH)
        found = free.next_free(found[-1], batch)
    parked, shown_parked = free.parked(3)
    statuses = [s for _, s in refused] + list(shown_parked)
    if not statuses:
        return Status(
            Code.UNSCHEDULABLE,
            Reason.NO_FREE_SLOT,
            f"map {key}: all {len(cmap.slots)} slots are taken or blocked",
            frozenset({WakeKey.map(key), WakeKey.model()}),
            cohort,
        )
    # A parked slot's keys are the cache's to watch: it wakes the map's key when one changes.
    waits = frozenset({WakeKey.map(key), WakeKey.model()}).union(*(s.waits_for for s in statuses))
    count = len(refused) + parked
    if count == 1:
        only = statuses[0]
        return replace(only, waits_for=waits, cohort=cohort, unservable=tuple(refused))
    first = list({id(s): s for s in statuses}.values())[:3]  # a node's slots share its refusal
    shown = "; ".join(f"{s.reason}: {s.message}" for s in first)
    covered = sum(1 for s in statuses if any(s is f for f in first))
    more = f"; and {count - covered} more" if count > covered else ""
    return Status(
        Code.UNSCHEDULABLE,
        Reason.NO_SERVABLE_SLOT,
        f"map {key}: none of its {count} free slots can be served now: {shown}{more}",
        waits,
        cohort,
        tuple(refused),
    )


def _node_refusal(where: str, slot: CompiledSlot, cluster: Cluster) -> Status | None:
    """Why the slot's node cannot take a pod now: missing, not Ready or cordoned."""
    node = cluster.nodes.get(slot.node)
    if node is None:
        return _wait(
            Reason.NODE_NOT_FOUND,
            f"{where}: node {slot.node} does not exist",
            WakeKey.node(slot.node),
            WakeKey.model(),
        )
    if not node.ready:
        return _wait(
            Reason.NODE_NOT_READY,
            f"{where}: node {slot.node} is not Ready",
            WakeKey.node(slot.node),
        )
    if not node.schedulable:
        return _wait(
            Reason.NODE_CORDONED, f"{where}: node {slot.node} is cordoned", WakeKey.node(slot.node)
        )
    return None


def _device_refusal(
    where: str, slot: CompiledSlot, cluster: Cluster, tolerations: tuple[Toleration, ...] = ()
) -> Status | None:
    """Why the slot's devices cannot be used now: no fresh inventory (where one is required),
    or a device missing, unhealthy or tainted (beyond the slot's `tolerations`) in it. Each
    waits for the node's inventory or the model."""
    inv = cluster.inventories.get(slot.node)
    found: tuple[Reason, str] | None = None
    if inv is None or not inv.fresh:
        if cluster.require_inventory:
            why = (
                "has no GPU inventory (is the agent running?)"
                if inv is None
                else "has a stale GPU inventory (agent stopped renewing its lease)"
            )
            found = (
                Reason.INVENTORY_MISSING if inv is None else Reason.INVENTORY_STALE,
                f"node {slot.node} {why}",
            )
    elif not slot.resolved:
        found = (Reason.DEVICE_MISSING, f"devices {slot.declared} not found on node {slot.node}")
    else:
        found = _first_device_problem(slot, inv.inventory, tolerations)
    if found is None:
        return None
    reason, message = found
    return _wait(reason, f"{where}: {message}", WakeKey.inventory(slot.node), WakeKey.model())


def _first_device_problem(
    slot: CompiledSlot, inventory: NodeInventory, tolerations: tuple[Toleration, ...] = ()
) -> tuple[Reason, str] | None:
    for uuid in slot.devices:
        device = inventory.by_uuid.get(uuid)
        instance = None
        if device is None and slot.mig is not None:
            # A MIG instance: it must still exist, and its parent GPU be healthy.
            device = inventory.mig_parent.get(uuid)
            instance = inventory.mig_by_uuid.get(uuid)
        if device is None:
            return Reason.DEVICE_MISSING, f"device {uuid} not found on node {slot.node}"
        # The slot's requirement was checked when its devices were resolved (compile).
        shown = f"{device.index} ({uuid})"
        problems = device_problems(
            device, None, shown, whole=slot.mig is None, tolerations=tolerations
        )
        tainted = taint_problem(instance.taints, tolerations, f"MIG {uuid}") if instance else None
        if tainted is not None:
            problems.append(tainted)
        if problems:
            reason, message = problems[0]
            return reason, f"{message} (node {slot.node})"
    return None


def _busy_refusal(
    pod: PodFacts,
    where: str,
    slot: CompiledSlot,
    sharing: Sharing,
    slots: SlotView,
    may_share: MayShare,
) -> Status | None:
    """Whether another pod still uses one of the slot's GPUs (and may not share it)."""
    for gpu in slot.gpus:
        for holder, their_sharing in slots.gpu_holders(slot.node, gpu).items():
            if holder == pod.uid:
                continue
            if sharing is Sharing.SHARED and their_sharing is Sharing.SHARED:
                continue
            held = slots.holding(holder)
            if held is not None and may_share(held.slot, gpu):
                continue
            return _wait(
                Reason.DEVICE_BUSY,
                f"{where}: GPU {gpu} on node {slot.node} is still used by {_who(slots, holder)}",
                WakeKey.gpu(slot.node, gpu),
            )
    if slot.mig is not None and slot.mig.parent:
        # A pod bound to the whole parent GPU (before the map named its MIG devices) still runs
        # on it: a MIG device of that GPU is not free until it is gone, shared or not.
        parent = GpuId.of_uuid(slot.mig.parent)
        for holder in slots.gpu_holders(slot.node, parent):
            if holder != pod.uid:
                return _wait(
                    Reason.DEVICE_BUSY,
                    f"{where}: GPU {slot.mig.parent} on node {slot.node}, the parent of "
                    f"{slot.mig.describe(','.join(slot.devices))}, is still used whole by "
                    f"{_who(slots, holder)}",
                    WakeKey.gpu(slot.node, parent),
                )
    return None


def _check_and_place(
    pod: PodFacts,
    slot_key: SlotKey,
    slot: CompiledSlot,
    env_mode: EnvMode,
    sharing: Sharing,
    generation: int,
    cluster: Cluster,
    slots: SlotView,
    may_share: MayShare = _never,
    provenance: Provenance | None = None,
    tolerations: tuple[Toleration, ...] = (),
) -> Placement | Status:
    """The slot's node, devices and GPUs checked in order, then the decision (see `plan`)."""
    where = f"map {slot_key.map} index {slot_key.index}"
    refusal = (
        _node_refusal(where, slot, cluster)
        or _device_refusal(where, slot, cluster, tolerations)
        or _busy_refusal(pod, where, slot, sharing, slots, may_share)
    )
    if refusal is not None:
        return refusal
    cvd = slot.cuda_visible_devices(env_mode)
    if not cvd:
        return _wait(
            Reason.DEVICE_MISSING,
            f"{where}: {env_mode.value} of devices {slot.declared} unknown "
            f"without an inventory of node {slot.node}",
            WakeKey.inventory(slot.node),
            WakeKey.model(),
        )
    decision = BindingDecision(
        slot_key.map,
        slot_key.index,
        slot.node,
        tuple(GpuUuid(u) for u in slot.devices),
        cvd,
        generation,
        provenance.revision if provenance else "",
        provenance.file if provenance else "",
    )
    return Placement(slot_key, decision, sharing, slot.gpus)


def _plan_legacy_pod(pod: PodFacts, cluster: Cluster, slots: SlotView) -> Placement | Status:
    assert pod.legacy_map is not None
    source = f"pod {pod.namespace}/{pod.name} annotation gpu-scheduling-map"
    try:
        line = pod_line(pod.legacy_map, pod.name, source)
    except PlacementError as exc:
        return Status(Code.UNRESOLVABLE, Reason.MAP_INVALID, exc.format(), frozenset())
    entries, index, entry = line.entries, line.index, line.entry
    if index is None:
        return Status(
            Code.UNRESOLVABLE,
            Reason.INDEX_INVALID,
            f"{source}: pod name has no '-<n>' suffix to pick a line by",
            frozenset(),
        )
    if entry is None:
        return Status(
            Code.UNRESOLVABLE,
            Reason.INDEX_NOT_IN_MAP,
            f"{source}: no line for index {index}",
            frozenset(),
        )
    key = legacy_map_key(pod.namespace, pod.name)
    slot_key = SlotKey(key, index)
    taken = _slot_taken(pod, slots, slot_key, f"legacy slot {slot_key}")
    if taken is not None:
        return taken
    slot = _legacy_slot(source, pod.namespace, index, entry, cluster)
    if isinstance(slot, Status):
        return slot
    # The lines of this pod's text that name each of its GPUs too: their pods share it.
    partners: dict[str, set[int]] = {}
    for shared in shared_gpus(entries):
        if index in shared.indices:
            gpu = slot.gpus[entry.devices.index(shared.device)] if slot.gpus else ""
            partners.setdefault(gpu, set()).update(i for i in shared.indices if i != index)

    def lines_share(held: SlotKey, gpu: str) -> bool:
        return held.map == key and held.index in partners.get(gpu, ())

    outcome = _check_and_place(
        pod, slot_key, slot, EnvMode.INDEX, Sharing.EXCLUSIVE, 0, cluster, slots, lines_share
    )
    if isinstance(outcome, Status):
        return outcome
    return _declared_elsewhere(source, pod.name, pod.namespace, slot, cluster.model) or outcome


def _legacy_slot(
    source: str, namespace: str, index: int, entry: LegacyEntry, cluster: Cluster
) -> CompiledSlot | Status:
    """A legacy line as a slot: its node resolved, judged by the gate on that node and the GPUs
    it names there, its devices found in the node's inventory."""
    found = resolve_node(entry.node, cluster.nodes, cluster.aliases, cluster.alias_label)
    node = found.node
    if node is None:
        return _wait(
            Reason.NODE_NOT_FOUND,
            f"{source}: {found.problem}",
            WakeKey.node(entry.node),
            WakeKey.nodes(),
        )
    inv = cluster.inventories.get(node)
    # The grants judge the node the line resolves to and the GPUs it names there (`gate`).
    refusal = judge(
        cluster.model.grants,
        namespace,
        GatePath.LEGACY,
        node,
        identify(inv.inventory if inv is not None else None, entry.devices),
        written=entry.node,
    )
    if refusal is not None:
        # Waits for the model: a new policy comes with a new model generation.
        return Status(
            Code.UNRESOLVABLE,
            Reason.NOT_GRANTED,
            f"{source}: {refusal}",
            frozenset({WakeKey.model()}),
        )
    uuids: list[GpuUuid] = []
    indices: list[int] = []
    if inv is not None:
        for ref in entry.devices:
            device = inv.inventory.find(ref)
            if device is None:
                return _wait(
                    Reason.DEVICE_MISSING,
                    f"{source}: device {ref} not found on node {node}",
                    WakeKey.inventory(node),
                )
            uuids.append(device.uuid)
            indices.append(device.index)
    else:
        indices = [d for d in entry.devices if isinstance(d, int)]
        uuids = [GpuUuid(d) for d in entry.devices if not isinstance(d, int)]
    return CompiledSlot(
        index,
        node,
        tuple(uuids) if len(uuids) == len(entry.devices) else (),
        tuple(indices) if len(indices) == len(entry.devices) else (),
        DeclaredDevices(tuple(entry.devices)),
    )


def _declared_elsewhere(
    source: str, pod_name: str, namespace: str, slot: CompiledSlot, model: Model
) -> Status | None:
    """A GPU the model serves to a map's slot is that slot's, held or not: a legacy line does not
    take it while the map's pod is away (`placement.declared`, which also names the one
    exception, the same slot written both ways)."""
    if slot.resolved:
        devices = tuple(
            Device(u, i) for u, i in zip(slot.devices, slot.device_indices, strict=True)
        )
    else:
        devices = tuple(Device(index=i) for i in slot.device_indices) or tuple(
            Device(uuid=u) for u in slot.devices
        )
    found = declared_elsewhere(model, namespace, pod_name, slot.node, devices)
    if found is None:
        return None
    return _wait(Reason.DEVICE_BUSY, f"{source}: {found}", WakeKey.model())


def slot_status(uid: str, slot_key: SlotKey, cluster: Cluster, slots: SlotView) -> Status | None:
    """Why the current slot `slot_key` could not take the pod `uid` now, or None if it could:
    what a rollout asks before it evicts a pod to move it there."""
    cmap = cluster.model.maps.get(slot_key.map)
    slot = cmap.slots.get(slot_key.index) if cmap is not None else None
    if cmap is None or slot is None:
        return _wait(
            Reason.INDEX_NOT_IN_MAP,
            f"map {slot_key.map} has no index {slot_key.index}",
            WakeKey.model(),
        )
    if slot.blocked:
        return _wait(slot.blocked, f"map {slot_key.map} index {slot_key.index}: {slot.message}")
    pod = PodFacts(slot_key.map.namespace, "", uid, {})
    outcome = _place_in_map(pod, cmap, slot_key.index, cluster, slots)
    return outcome if isinstance(outcome, Status) else None
