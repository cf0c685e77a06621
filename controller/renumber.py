"""Bound pods whose GPUs were renumbered under them, written onto the pods as a condition.

A binding keeps GPUs by UUID; in envMode `index` the container gets NVML indices
(`CUDA_VISIBLE_DEVICES=1`), frozen at binding time. When a node's inventory later numbers those
UUIDs differently (a reboot, a GPU replaced or reseated), the container would use other GPUs
than the ones it holds at its next start. Such a pod gets condition `DevicesRenumbered=True` and
a Warning Event; its map's status counts it; `gpuplace_renumbered_pods` counts them all.

Contract: `track` and `forget` run on informer threads, `check` on the model queue's worker; every
method takes the lock. Condition writes go to a small executor.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from kubeio.client import Kube
from kubeio.errors import APIError
from kubeio.events import NORMAL, WARNING, EventRecorder, ObjectRef
from kubeio.paths import PODS
from kubeio.times import now_time
from placement.annotations import RENUMBERED_CONDITION, BindingDecision
from placement.inventory import NodeInventory
from placement.reasons import EventReason
from placement.types import GpuUuid, MapKey, NodeName

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class BoundIndices:
    ref: ObjectRef
    map: MapKey
    node: NodeName
    uuids: tuple[GpuUuid, ...]
    indices: tuple[int, ...]  # what the container's CUDA_VISIBLE_DEVICES says, by position


def bound_indices(ref: ObjectRef, node: str, decision: BindingDecision) -> BoundIndices | None:
    """What to watch of a binding: only envMode index bindings name GPUs by number."""
    parts = decision.cuda_visible_devices.split(",")
    if not decision.devices or not all(p.isdigit() for p in parts):
        return None
    if len(parts) != len(decision.devices):
        return None
    return BoundIndices(
        ref, decision.map, NodeName(node), tuple(decision.devices), tuple(int(p) for p in parts)
    )


def renumbering(bound: BoundIndices, inventory: NodeInventory) -> str | None:
    """How the node's inventory now disagrees with the pod's indices, or None if it does not."""
    moved: list[str] = []
    for uuid, index in zip(bound.uuids, bound.indices, strict=True):
        device = inventory.by_uuid.get(uuid)
        if device is None or device.index == index:
            continue  # a missing GPU is DeviceMissing, not a renumbering
        now = next((d.uuid for d in inventory.devices if d.index == index), None)
        moved.append(
            f"index {index} was {uuid} (now index {device.index})"
            + (f" and now names {now}" if now else "")
        )
    if not moved:
        return None
    return (
        f"GPUs of node {bound.node} were renumbered: CUDA_VISIBLE_DEVICES="
        f"{','.join(map(str, bound.indices))} no longer names the GPUs this pod was bound to: "
        f"{'; '.join(moved)}. The container uses the new numbering at its next start: delete the "
        "pod to bind it again (envMode uuid is not affected by renumbering)"
    )


class RenumberTracker:
    def __init__(
        self, kube: Kube, events: EventRecorder, on_count: Callable[[int], None] = lambda _n: None
    ) -> None:
        self.kube = kube
        self.events = events
        self.on_count = on_count
        self._lock = threading.Lock()
        self._bound: dict[str, BoundIndices] = {}  # uid -> its binding's indices
        self._by_node: dict[NodeName, set[str]] = {}
        self._renumbered: dict[str, str] = {}  # uid -> message
        self._executor = ThreadPoolExecutor(2, thread_name_prefix="renumber")

    def track(self, uid: str, bound: BoundIndices) -> None:
        with self._lock:
            if uid in self._bound:
                return
            self._bound[uid] = bound
            self._by_node.setdefault(bound.node, set()).add(uid)

    def forget(self, uid: str) -> MapKey | None:
        with self._lock:
            bound = self._bound.pop(uid, None)
            if bound is None:
                return None
            self._by_node.get(bound.node, set()).discard(uid)
            was = self._renumbered.pop(uid, None)
            count = len(self._renumbered)
        if was is not None:
            self.on_count(count)
        return bound.map

    def count(self, key: MapKey) -> int:
        with self._lock:
            return sum(1 for uid in self._renumbered if self._bound[uid].map == key)

    def is_renumbered(self, uid: str) -> bool:
        with self._lock:
            return uid in self._renumbered

    def check(self, node: NodeName, inventory: NodeInventory | None) -> set[MapKey]:
        """Judges the pods bound to `node` against its inventory; returns the maps whose count
        of renumbered pods changed."""
        if inventory is None:
            return set()
        changed: list[tuple[str, BoundIndices, str | None]] = []
        with self._lock:
            for uid in self._by_node.get(node, set()):
                bound = self._bound[uid]
                message = renumbering(bound, inventory)
                if self._renumbered.get(uid) == message:
                    continue
                if message is None:
                    del self._renumbered[uid]
                else:
                    self._renumbered[uid] = message
                changed.append((uid, bound, message))
            count = len(self._renumbered)
        for _uid, bound, message in changed:
            self._executor.submit(self._write, bound, message)
        if changed:
            self.on_count(count)
        return {bound.map for _uid, bound, _m in changed}

    def check_all(self, inventories: dict[NodeName, NodeInventory]) -> set[MapKey]:
        with self._lock:
            nodes = list(self._by_node)
        changed: set[MapKey] = set()
        for node in nodes:
            changed |= self.check(node, inventories.get(node))
        return changed

    def _write(self, bound: BoundIndices, message: str | None) -> None:
        now = now_time()
        condition = {
            "type": RENUMBERED_CONDITION,
            "status": "True" if message else "False",
            "reason": EventReason.INDICES_NAME_OTHER_GPUS if message else EventReason.INDICES_MATCH,
            "message": message or "the pod's GPU indices name the GPUs it was bound to",
            "lastTransitionTime": now,
        }
        ref = bound.ref
        try:
            self.kube.patch(
                PODS.item(ref.name, ref.namespace, "status"),
                {"status": {"conditions": [condition]}},
                content_type="application/strategic-merge-patch+json",
            )
        except APIError as exc:
            log.info("condition %s not written on %s: %s", RENUMBERED_CONDITION, ref.name, exc)
        if message:
            self.events.emit(ref, WARNING, EventReason.DEVICES_RENUMBERED, message)
        else:
            self.events.emit(
                ref, NORMAL, EventReason.DEVICES_NUMBERED_AS_BOUND, condition["message"]
            )
