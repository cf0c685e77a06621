"""Reading the facts the binder needs from a pod object (the only place that knows its shape)."""

from __future__ import annotations

from typing import Any

from controller.slotcache import Holding
from placement.annotations import (
    LEGACY_ANNOTATION,
    MAP_LABEL,
    binding_annotations,
    decode_binding,
    legacy_map_key,
    verify_binding,
)
from placement.binding import PodFacts
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


def unverified_binding(pod: Obj, key: bytes) -> str | None:
    """Why the gpuplace.io/* annotations of a bound pod are not a binding the binder signed, or
    None when they are (or when the pod carries none)."""
    annotations = annotations_of(pod)
    present = binding_annotations(annotations)
    if not present:
        return None
    meta = pod["metadata"]
    if verify_binding(key, uid_of(pod), meta["namespace"], annotations):
        return None
    return (
        f"annotation(s) {', '.join(present)} on pod {name_of(pod)} were not written by the "
        "gpuplace binder (signature missing or wrong): the pod holds no GPU and no slot"
    )


def holding_from_bound(pod: Obj, shared_maps: set[str], signing_key: bytes) -> Holding | None:
    """What a bound pod holds, from the annotations its Binding wrote (rebuild after failover).

    Only a binding whose signature verifies holds anything: hand-written or rewritten annotations
    would otherwise let any pod squat GPUs promised to another.
    """
    meta = pod["metadata"]
    annotations = annotations_of(pod)
    if not verify_binding(signing_key, uid_of(pod), meta["namespace"], annotations):
        return None
    decision = decode_binding(meta["namespace"], annotations)
    if decision is None:
        return None
    key = decision.map
    if decision.map.name.startswith("legacy."):
        key = legacy_map_key(meta["namespace"], meta["name"])
    gpus: tuple[str, ...] = tuple(decision.devices)
    if not gpus:
        gpus = tuple(f"#{i}" for i in decision.cuda_visible_devices.split(",") if i.isdigit())
    sharing = Sharing.SHARED if str(key) in shared_maps else Sharing.EXCLUSIVE
    return Holding(
        uid_of(pod),
        name_of(pod),
        SlotKey(key, decision.index),
        NodeName(pod["spec"]["nodeName"]),
        gpus,
        sharing,
        assumed=False,
        revision=decision.revision,
    )
