"""What the controller's informers keep of each object: the fields gpuplace reads, nothing else.

Every replica caches every pod of the binder's schedulerNames and every node. Whole objects would
let anyone who may create a pod grow every replica by what the pod carries (a pod with
`schedulerName: gpuplace` and no map label never meets the webhook, and may carry 256 KiB of
annotations), and a restart would list all of it again. The informers trim each object as it
arrives (`kubeio.informer.Transform`), so a pod costs about the same whatever it carries beside
what gpuplace reads (docs/trust.md, "Bounded by design").

The readers these keep fields for: `kubeio.pod.Pod` (metadata, spec.nodeName, schedulerName,
resourceClaims, containers' env and claims, status.phase, conditions, resourceClaimStatuses),
`placement.podmeta` and `placement.indexing` (labels, the rank annotations, the legacy text),
the key ring (every gpuplace.io/* annotation), `controller.nodekeeper` (a node's labels,
spec.unschedulable, its Ready condition) and the grants (a node's labels).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypedDict

from kubeio.client import Obj
from kubeio.shapes import Shape
from placement.annotations import (
    INDEX_LABEL,
    JOB_COMPLETION_INDEX,
    JOBSET_GLOBAL_INDEX_LABEL,
    JOBSET_NAME_LABEL,
    KUEUE_POD_GROUP_INDEX_LABEL,
    LEGACY_ANNOTATION,
    LWS_GROUP_INDEX_LABEL,
    LWS_WORKER_INDEX_LABEL,
    MANAGED_ENV,
    MAP_LABEL,
    PREFIX,
    STATEFULSET_INDEX_LABEL,
)
from placement.indexing import RANK_ANNOTATIONS

#: A pod's labels are kept whole up to this many bytes (keys and values): a map's `indexLabel` may
#: name any label. Past it only the labels gpuplace knows by name are kept; a pod of a map whose
#: `indexLabel` is another then waits IndexInvalid (its label unread), as if it lacked it.
MAX_LABEL_BYTES = 16 * 1024
KNOWN_LABELS = frozenset(
    {
        MAP_LABEL,
        INDEX_LABEL,
        STATEFULSET_INDEX_LABEL,
        JOB_COMPLETION_INDEX,
        JOBSET_GLOBAL_INDEX_LABEL,
        JOBSET_NAME_LABEL,
        LWS_GROUP_INDEX_LABEL,
        LWS_WORKER_INDEX_LABEL,
        KUEUE_POD_GROUP_INDEX_LABEL,
    }
)
#: A condition's message is kept up to this many characters (what a reason and a summary need).
MAX_MESSAGE_CHARS = 1024
#: At most this many conditions, entries of spec.resourceClaims, of status.resourceClaimStatuses,
#: and owner references are kept; the apiserver's own objects carry a handful.
MAX_ENTRIES = 32

_META = ("namespace", "name", "uid", "generateName", "resourceVersion", "creationTimestamp")
_OWNER = ("apiVersion", "kind", "name", "uid", "controller")


def _pick(source: Mapping[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    return {k: source[k] for k in keys if k in source}


def _metadata(meta: Mapping[str, Any]) -> dict[str, Any]:
    out = _pick(meta, _META)
    if meta.get("deletionTimestamp"):
        out["deletionTimestamp"] = meta["deletionTimestamp"]
    owners = meta.get("ownerReferences")
    if isinstance(owners, list):
        out["ownerReferences"] = [
            _pick(o, _OWNER) for o in owners[:MAX_ENTRIES] if isinstance(o, dict)
        ]
    return out


def pod_labels(labels: Mapping[str, Any]) -> dict[str, Any]:
    """Every label while they are small (`MAX_LABEL_BYTES`), else those gpuplace knows."""
    size = sum(len(k) + len(str(v)) for k, v in labels.items())
    if size <= MAX_LABEL_BYTES:
        return dict(labels)
    return {k: v for k, v in labels.items() if k in KNOWN_LABELS}


def pod_annotations(annotations: Mapping[str, Any], legacy: bool) -> dict[str, Any]:
    """gpuplace.io/* (the binding and its signature), the rank annotations, and, for a pod of
    the earlier tools' schedulerNames (`legacy`), their gpu-scheduling-map text (the binder
    reads all of it; the webhook and the parser bound its size)."""
    return {
        k: v
        for k, v in annotations.items()
        if k.startswith(PREFIX) or k in RANK_ANNOTATIONS or (legacy and k == LEGACY_ANNOTATION)
    }


def _condition(cond: Mapping[str, Any]) -> dict[str, Any]:
    out = _pick(cond, ("type", "status", "reason", "lastTransitionTime"))
    message = cond.get("message")
    if isinstance(message, str):
        out["message"] = message[:MAX_MESSAGE_CHARS]
    return out


def _container(container: Mapping[str, Any]) -> dict[str, Any]:
    """A container's name, the env entries gpuplace wires (how the pod was admitted), and the
    names of the claims it uses."""
    out: dict[str, Any] = _pick(container, ("name",))
    env = container.get("env")
    if isinstance(env, list):
        out["env"] = [e for e in env if isinstance(e, dict) and e.get("name") in MANAGED_ENV]
    resources = container.get("resources")
    if isinstance(resources, dict) and isinstance(resources.get("claims"), list):
        claims = resources["claims"][:MAX_ENTRIES]
        out["resources"] = {"claims": [_pick(c, ("name",)) for c in claims if isinstance(c, dict)]}
    return out


def _entries(value: object) -> list[Any]:
    return (
        [e for e in value[:MAX_ENTRIES] if isinstance(e, dict)] if isinstance(value, list) else []
    )


def trim_pod(obj: Obj, *, legacy: bool) -> Obj:
    """A pod as the controller's informers keep it. `legacy`: the informer of one of the
    earlier tools' schedulerNames (their pods' gpu-scheduling-map text is kept)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    out_meta = _metadata(meta)
    out_meta["labels"] = pod_labels(meta.get("labels") or {})
    out_meta["annotations"] = pod_annotations(meta.get("annotations") or {}, legacy)
    out_spec: dict[str, Any] = _pick(spec, ("nodeName", "schedulerName"))
    for list_name in ("initContainers", "containers"):
        items = spec.get(list_name)
        if isinstance(items, list):
            out_spec[list_name] = [_container(c) for c in items if isinstance(c, dict)]
    if "resourceClaims" in spec:
        out_spec["resourceClaims"] = _entries(spec["resourceClaims"])
    out_status: dict[str, Any] = _pick(status, ("phase",))
    if "conditions" in status:
        out_status["conditions"] = [_condition(c) for c in _entries(status["conditions"])]
    if "resourceClaimStatuses" in status:
        out_status["resourceClaimStatuses"] = _entries(status["resourceClaimStatuses"])
    return {"metadata": out_meta, "spec": out_spec, "status": out_status}


def trim_node(obj: Obj) -> Obj:
    """A node as the controller keeps it: its labels (aliases, cliques, the grants' selectors),
    spec.unschedulable and its Ready condition; not its images, addresses, capacity or
    annotations (the kubelet and others write those, several KiB a node)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    conditions = (obj.get("status") or {}).get("conditions") or []
    out_meta = _metadata(meta)
    out_meta["labels"] = dict(meta.get("labels") or {})
    ready = [_condition(c) for c in _entries(conditions) if c.get("type") == "Ready"]
    return {
        "metadata": out_meta,
        "spec": _pick(spec, ("unschedulable",)),
        "status": {"conditions": ready},
    }


def same_node(old: Obj, new: Obj) -> bool:
    """Whether two trimmed versions of a node differ in their resourceVersion alone: a heartbeat
    (the kubelet's, kwok's) renews `lastHeartbeatTime`, which `trim_node` does not keep, so
    nothing the controller reads changed."""
    if old.keys() != new.keys():
        return False
    for name, value in new.items():
        kept = old[name]
        if name == "metadata" and isinstance(value, dict) and isinstance(kept, dict):
            if kept.keys() != value.keys() or any(
                k != "resourceVersion" and kept[k] != v for k, v in value.items()
            ):
                return False
        elif kept != value:
            return False
    return True


def trim_namespace(obj: Obj) -> Obj:
    """A namespace as the controller keeps it: its name and labels (the legacy namespace
    selector reads them)."""
    meta = obj.get("metadata") or {}
    out_meta = _metadata(meta)
    out_meta["labels"] = dict(meta.get("labels") or {})
    return {"metadata": out_meta}


# -- what is decoded at all (kubeio/shapes.py): the fields the trims above read, no others ------
# Each field may be null in what an apiserver sends (a Go nil without omitempty): `| None`.


class _OwnerReference(TypedDict, total=False):
    apiVersion: str | None
    kind: str | None
    name: str | None
    uid: str | None
    controller: bool | None


class _Metadata(TypedDict, total=False):
    namespace: str | None
    name: str | None
    uid: str | None
    generateName: str | None
    resourceVersion: str | None
    creationTimestamp: str | None
    deletionTimestamp: str | None
    ownerReferences: list[_OwnerReference] | None
    labels: dict[str, Any] | None
    annotations: dict[str, Any] | None


class _Condition(TypedDict, total=False):
    type: str | None
    status: str | None
    reason: str | None
    message: str | None
    lastTransitionTime: str | None


class _ContainerResources(TypedDict, total=False):
    claims: list[dict[str, Any]] | None


class _Container(TypedDict, total=False):
    name: str | None
    env: list[dict[str, Any]] | None
    resources: _ContainerResources | None


class _PodSpec(TypedDict, total=False):
    nodeName: str | None
    schedulerName: str | None
    initContainers: list[_Container] | None
    containers: list[_Container] | None
    resourceClaims: list[dict[str, Any]] | None


class _PodStatus(TypedDict, total=False):
    phase: str | None
    conditions: list[_Condition] | None
    resourceClaimStatuses: list[dict[str, Any]] | None


class _Pod(TypedDict, total=False):
    metadata: _Metadata | None
    spec: _PodSpec | None
    status: _PodStatus | None


class _NodeSpec(TypedDict, total=False):
    unschedulable: bool | None


class _NodeStatus(TypedDict, total=False):
    conditions: list[_Condition] | None


class _Node(TypedDict, total=False):
    metadata: _Metadata | None
    spec: _NodeSpec | None
    status: _NodeStatus | None


#: A pod's fields as `trim_pod` reads them: its managedFields, volumes, tolerations, container
#: images and statuses are never built.
POD_SHAPE = Shape(_Pod)
#: A node's fields as `trim_node` reads them: its images, addresses, capacity and annotations are
#: never built.
NODE_SHAPE = Shape(_Node)
