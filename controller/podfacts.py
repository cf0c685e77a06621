"""Reading the facts the binder needs from a pod object (the only place that knows its shape)."""

from __future__ import annotations

from typing import Any

from controller.slotcache import Holding
from controller.trustreport import Judged
from kubeio.events import ObjectRef
from placement.annotations import (
    LEGACY_ANNOTATION,
    MAP_LABEL,
    UNVERIFIABLE_CONDITION,
    BindingDecision,
    binding_annotations,
    decode_binding,
    legacy_map_key,
    name_ordinal,
)
from placement.binding import Cluster, PodFacts
from placement.devices import GpuId
from placement.errors import PlacementError
from placement.keyring import TrustView, Verdict
from placement.legacy import parse_legacy
from placement.types import NodeName, Sharing, SlotKey

Obj = dict[str, Any]
TERMINAL = ("Succeeded", "Failed")


def facts(pod: Obj, legacy: bool) -> PodFacts:
    meta = pod["metadata"]
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    owner = next(
        (o.get("kind") for o in meta.get("ownerReferences") or [] if o.get("controller")), None
    )
    generate_name = meta.get("generateName") or ""
    return PodFacts(
        namespace=meta["namespace"],
        name=meta["name"],
        uid=meta["uid"],
        labels=labels,
        owner_kind=owner,
        generated_name=bool(generate_name) and str(meta["name"]).startswith(generate_name),
        map_name=labels.get(MAP_LABEL),
        legacy_map=annotations.get(LEGACY_ANNOTATION) if legacy else None,
    )


def uid_of(pod: Obj) -> str:
    return str(pod["metadata"]["uid"])


def name_of(pod: Obj) -> str:
    return f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"


def is_bound(pod: Obj) -> bool:
    return bool(pod.get("spec", {}).get("nodeName"))


def is_finished(pod: Obj) -> bool:
    return pod.get("status", {}).get("phase") in TERMINAL


def is_deleting(pod: Obj) -> bool:
    return bool(pod["metadata"].get("deletionTimestamp"))


def annotations_of(pod: Obj) -> dict[str, str]:
    return dict(pod["metadata"].get("annotations") or {})


def created_of(pod: Obj) -> str:
    return str(pod["metadata"].get("creationTimestamp") or "")


def verdict(pod: Obj, trust: TrustView) -> Verdict:
    """What the pod's gpuplace.io/* annotations prove under the key ring (placement/keyring.py)."""
    meta = pod["metadata"]
    return trust.judge(uid_of(pod), meta["namespace"], created_of(pod), annotations_of(pod))


class BoundPod:
    """A bound pod as one event brings it: its binding decoded, and judged under the key ring, at
    most once (when first asked), however many parts of the controller look at it."""

    __slots__ = ("_decision", "_verdict", "obj", "trust", "uid")

    def __init__(self, obj: Obj, trust: TrustView | None) -> None:
        self.obj = obj
        self.trust = trust
        self.uid = uid_of(obj)
        self._decision: BindingDecision | object | None = _UNREAD
        self._verdict: Verdict | object | None = _UNREAD

    @property
    def decision(self) -> BindingDecision | None:
        """The binding its annotations declare (None: no gpuplace binding on it)."""
        if self._decision is _UNREAD:
            self._decision = decode_binding(
                self.obj["metadata"]["namespace"], annotations_of(self.obj)
            )
        return self._decision  # type: ignore[return-value]

    @property
    def verdict(self) -> Verdict | None:
        """What the ring says of that binding (None while no ring is loaded: a standby)."""
        if self._verdict is _UNREAD:
            self._verdict = verdict(self.obj, self.trust) if self.trust is not None else None
        return self._verdict  # type: ignore[return-value]

    @property
    def holds(self) -> bool:
        judged_as = self.verdict
        return judged_as is not None and judged_as.trust.holds

    def judged(self) -> Judged:
        meta = self.obj["metadata"]
        assert self.verdict is not None, "judged without a key ring"
        decision = self.decision
        ref = ObjectRef("Pod", meta["namespace"], meta["name"], self.uid)
        return Judged(ref, decision.map if decision is not None else None, self.verdict)

    def holding(self, shared_maps: set[str]) -> Holding | None:
        """What the pod holds, from the annotations its Binding wrote (rebuild after failover).

        Only a binding the ring proves or cannot disprove holds anything (`Trust.holds`):
        hand-written or rewritten annotations would otherwise let any pod squat GPUs promised to
        another, and a binding whose key was lost must keep its GPUs from everyone else.
        """
        decision = self.decision
        if not self.holds or decision is None:
            return None
        meta = self.obj["metadata"]
        key = decision.map
        if decision.map.name.startswith("legacy."):
            key = legacy_map_key(meta["namespace"], meta["name"])
        gpus: tuple[str, ...] = tuple(decision.devices)
        if not gpus:
            gpus = tuple(
                GpuId.of_index(int(i))
                for i in decision.cuda_visible_devices.split(",")
                if i.isdigit()
            )
        sharing = Sharing.SHARED if str(key) in shared_maps else Sharing.EXCLUSIVE
        return Holding(
            self.uid,
            name_of(self.obj),
            SlotKey(key, decision.index),
            NodeName(self.obj["spec"]["nodeName"]),
            gpus,
            sharing,
            assumed=False,
            revision=decision.revision,
        )


_UNREAD = object()


def flagged_unverifiable(pod: Obj) -> bool:
    """Whether the pod's condition says its binding is unverifiable now."""
    return any(
        c.get("type") == UNVERIFIABLE_CONDITION and c.get("status") == "True"
        for c in pod.get("status", {}).get("conditions") or []
    )


def prebound_legacy(pod: Obj, cluster: Cluster) -> Holding | str | None:
    """What a pod that another scheduler bound holds, by its `gpu-scheduling-map` line (cut-over
    from the earlier tools): a Holding; a reason it holds nothing (outside its namespace's
    grants); or None when it is not such a pod (gpuplace annotations, no line for its index)."""
    meta = pod["metadata"]
    annotations = annotations_of(pod)
    text = annotations.get(LEGACY_ANNOTATION)
    if text is None or binding_annotations(annotations):
        return None
    index = name_ordinal(meta["name"])
    try:
        entries = parse_legacy(text, f"pod {name_of(pod)} annotation {LEGACY_ANNOTATION}")
    except PlacementError:
        return None
    entry = next((e for e in entries if e.index == index), None)
    if index is None or entry is None:
        return None
    refusal = cluster.model.grants.refusal(meta["namespace"], entry.node, entry.devices)
    if refusal is not None:
        return refusal
    node = NodeName(pod["spec"]["nodeName"])
    state = cluster.inventories.get(node)
    gpus: list[str] = []
    for ref in entry.devices:
        # Kept by UUID, as binder holdings are, whenever the node's inventory names the device.
        device = state.inventory.find(ref) if state is not None else None
        gpus.append(GpuId.of_uuid(device.uuid) if device is not None else GpuId.of(ref))
    return Holding(
        uid_of(pod),
        name_of(pod),
        SlotKey(legacy_map_key(meta["namespace"], meta["name"]), index),
        node,
        tuple(gpus),
        Sharing.EXCLUSIVE,
        assumed=False,
    )
