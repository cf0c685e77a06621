"""What `gpuplace status`, `gpuplace explain` and the demo show: read from any cluster."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from kubeio.client import Kube
from kubeio.errors import APINotFoundError
from kubeio.paths import CONFIGMAPS, EVENTS, PODS
from placement.annotations import (
    CUDA_ANNOTATION,
    DEVICES_ANNOTATION,
    DRIFTED_CONDITION,
    ENV_CUDA_VISIBLE_DEVICES,
    GENERATION_ANNOTATION,
    INDEX_ANNOTATION,
    LEGACY_ANNOTATION,
    LEGACY_MAP_PREFIX,
    MAP_ANNOTATION,
    MAP_LABEL,
    PLACEMENT_MAP_LABEL,
    RENUMBERED_CONDITION,
    REVISION_ANNOTATION,
    SOURCE_FILE_ANNOTATION,
    STATUS_ANNOTATION,
    UNVERIFIABLE_CONDITION,
    binding_annotations,
    name_ordinal,
)
from placement.errors import PlacementError
from placement.grants import POLICY_CONFIGMAP
from placement.inventory import INVENTORY_KEY, INVENTORY_NAMESPACE, NodeInventory
from placement.legacy import parse_legacy, shared_gpus
from placement.status import MapStatus

Obj = dict[str, Any]
_FIELD_REF = re.compile(r"^metadata\.annotations\['([^']+)'\]$")


def table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    rows = [list(map(str, r)) for r in rows]
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
    out = [line.rstrip()]
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return "\n".join(out)


def container_env(pod: Obj, name: str, container: int = 0) -> str:
    """The value a container will see for env var `name`: literal, or resolved like the kubelet
    resolves an annotation fieldRef (empty when the pod is not bound yet)."""
    containers = pod.get("spec", {}).get("containers") or []
    if len(containers) <= container:
        return ""
    annotations = pod["metadata"].get("annotations") or {}
    for env in containers[container].get("env") or []:
        if env.get("name") != name:
            continue
        if "value" in env:
            return str(env["value"])
        path = (env.get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath", "")
        match = _FIELD_REF.match(path)
        return str(annotations.get(match.group(1), "")) if match else f"<{path}>"
    return "(not set)"


@dataclass(frozen=True)
class PodRow:
    namespace: str
    name: str
    map: str
    index: str
    node: str
    devices: str
    cuda_visible_devices: str
    phase: str
    reason: str

    @classmethod
    def of(cls, pod: Obj) -> PodRow:
        meta = pod["metadata"]
        ann = meta.get("annotations") or {}
        labels = meta.get("labels") or {}
        map_name = (
            labels.get(MAP_LABEL)
            or ann.get(MAP_ANNOTATION)
            or ("(legacy)" if LEGACY_ANNOTATION in ann else "")
        )
        reason = ""
        if not pod["spec"].get("nodeName"):
            for cond in pod.get("status", {}).get("conditions") or []:
                if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
                    reason = f"{cond.get('reason')}: {cond.get('message')}"
        else:
            drifted = drift_condition(pod)
            if drifted is not None:
                reason = f"Drifted ({drifted.get('reason')}): {drifted.get('message')}"
            renumbered = true_condition(pod, RENUMBERED_CONDITION)
            if renumbered is not None:
                reason = f"DevicesRenumbered: {renumbered.get('message')}"
            unverifiable = true_condition(pod, UNVERIFIABLE_CONDITION)
            if unverifiable is not None:
                reason = f"BindingUnverifiable: {unverifiable.get('message')}"
            prebound = prebound_line(pod)
            if prebound is not None:
                reason = (
                    f"bound by {pod['spec'].get('schedulerName')} (cut-over): holds GPUs "
                    f"{prebound} of its {LEGACY_ANNOTATION} line"
                )
        return cls(
            meta["namespace"],
            meta["name"],
            map_name,
            ann.get(INDEX_ANNOTATION, ""),
            pod["spec"].get("nodeName", ""),
            ann.get(DEVICES_ANNOTATION, ""),
            container_env(pod, ENV_CUDA_VISIBLE_DEVICES),
            pod.get("status", {}).get("phase", ""),
            reason,
        )


def true_condition(pod: Obj, kind: str) -> Obj | None:
    for cond in pod.get("status", {}).get("conditions") or []:
        if cond.get("type") == kind and cond.get("status") == "True":
            return dict(cond)
    return None


def prebound_line(pod: Obj) -> str | None:
    """The devices of a pod bound by the earlier tools (legacy line, no gpuplace binding)."""
    ann = pod["metadata"].get("annotations") or {}
    if LEGACY_ANNOTATION not in ann or binding_annotations(ann) or not pod["spec"].get("nodeName"):
        return None
    index = name_ordinal(pod["metadata"]["name"])
    try:
        entries = parse_legacy(ann[LEGACY_ANNOTATION], LEGACY_ANNOTATION)
    except PlacementError:
        return None
    entry = next((e for e in entries if e.index == index), None)
    return None if entry is None else ",".join(map(str, entry.devices))


def drift_condition(pod: Obj) -> Obj | None:
    """The pod's Drifted condition while it is True."""
    for cond in pod.get("status", {}).get("conditions") or []:
        if cond.get("type") == DRIFTED_CONDITION and cond.get("status") == "True":
            return dict(cond)
    return None


def gpuplace_pods(kube: Kube, scheduler_names: Sequence[str]) -> list[PodRow]:
    rows: list[PodRow] = []
    for name in scheduler_names:
        items = kube.get(PODS.collection(), fieldSelector=f"spec.schedulerName={name}")["items"]
        rows.extend(PodRow.of(p) for p in items)
    return sorted(rows, key=lambda r: (r.namespace, r.name))


def pod_table(rows: Iterable[PodRow]) -> str:
    return table(
        (
            "NAMESPACE",
            "POD",
            "MAP",
            "INDEX",
            "NODE",
            "GPU UUIDS",
            "CUDA_VISIBLE_DEVICES",
            "PHASE",
            "REASON",
        ),
        [
            (
                r.namespace,
                r.name,
                r.map,
                r.index,
                r.node or "-",
                r.devices or "-",
                r.cuda_visible_devices or "-",
                r.phase,
                r.reason or "-",  # last column, in full: it names what the pod waits for
            )
            for r in rows
        ],
    )


def map_statuses(kube: Kube) -> list[tuple[str, MapStatus | None]]:
    items = kube.get(CONFIGMAPS.collection(), labelSelector=f"{PLACEMENT_MAP_LABEL}=true")["items"]
    out: list[tuple[str, MapStatus | None]] = []
    for cm in items:
        meta = cm["metadata"]
        text = (meta.get("annotations") or {}).get(STATUS_ANNOTATION)
        status = MapStatus.from_json(text) if text else None
        out.append((f"{meta['namespace']}/{meta['name']}", status))
    return sorted(out, key=lambda x: x[0])


def map_table(statuses: Iterable[tuple[str, MapStatus | None]]) -> str:
    rows = []
    for key, s in statuses:
        if s is None:
            rows.append((key, "Pending", "-", "-", "-", "-", "-", "no status yet"))
        else:
            rows.append(
                (
                    key,
                    s.phase.value,
                    str(s.slots.total),
                    str(s.slots.bound),
                    str(s.slots.drifted),
                    str(s.slots.blocked),
                    str(s.slots.renumbered),
                    s.message[:100],
                )
            )
    headers = ("MAP", "PHASE", "SLOTS", "BOUND", "DRIFTED", "BLOCKED", "RENUMBERED", "MESSAGE")
    return table(headers, rows)


def placement_policy_exists(kube: Kube, namespace: str = "gpuplace-system") -> bool:
    try:
        kube.get(CONFIGMAPS.item(POLICY_CONFIGMAP, namespace))
    except APINotFoundError:
        return False
    return True


def degraded_devices(kube: Kube, namespace: str = INVENTORY_NAMESPACE) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for cm in kube.get(CONFIGMAPS.collection(namespace))["items"]:
        text = (cm.get("data") or {}).get(INVENTORY_KEY)
        if text is None:
            continue
        try:
            inv = NodeInventory.from_json(text)
        except ValueError:
            continue
        for dev in inv.devices:
            if not dev.healthy:
                out.append((inv.node, f"{dev.index} {dev.uuid}: {dev.health_reason}"))
    return out


def _provenance(pod: Obj) -> list[str]:
    """Where the binding came from: a placement map's model generation, or (legacy pods) the
    pod's own gpu-scheduling-map line, which no model generation describes."""
    meta = pod["metadata"]
    ann = meta.get("annotations") or {}
    if not ann.get(MAP_ANNOTATION, "").startswith(LEGACY_MAP_PREFIX):
        return [f"  model generation: {ann.get(GENERATION_ANNOTATION, '?')}"]
    out = [
        f"  legacy mode: placed by line {ann.get(INDEX_ANNOTATION, '?')} of the pod's own "
        f"{LEGACY_ANNOTATION} annotation (no placement map, so no model generation applies)"
    ]
    index = name_ordinal(meta["name"])
    try:
        entries = parse_legacy(ann.get(LEGACY_ANNOTATION, ""), LEGACY_ANNOTATION)
    except PlacementError:
        return out
    for shared in shared_gpus(entries):
        if index in shared.indices:
            out.append(f"  {shared.describe()}")
    return out


def explain(kube: Kube, namespace: str, name: str) -> str:
    """Why a pod is where it is, or why it is Pending, in a few lines."""
    try:
        pod = kube.get(PODS.item(name, namespace))
    except (APINotFoundError, ValueError):  # ValueError: no such name can exist (".", "")
        return f"pod {namespace}/{name} not found"
    row = PodRow.of(pod)
    ann = pod["metadata"].get("annotations") or {}
    lines = [f"pod {namespace}/{name}"]
    if row.node:
        if CUDA_ANNOTATION in ann:
            lines.append(f"  bound to node {row.node} by gpuplace: map {row.map} index {row.index}")
            lines.append(f"  GPUs: {row.devices or '(indices only)'}")
            lines.append(f"  CUDA_VISIBLE_DEVICES in the container: {row.cuda_visible_devices}")
            lines.extend(_provenance(pod))
            if not ann.get(MAP_ANNOTATION, "").startswith(LEGACY_MAP_PREFIX):
                lines.append(f"  placed by: {placed_by(ann)}")
            drifted = drift_condition(pod)
            if drifted is not None:
                lines.append(f"  Drifted ({drifted.get('reason')}): {drifted.get('message')}")
            unverifiable = true_condition(pod, UNVERIFIABLE_CONDITION)
            if unverifiable is not None:
                lines.append(f"  BindingUnverifiable: {unverifiable.get('message')}")
        else:
            lines.append(f"  bound to node {row.node}, not by gpuplace (no placement annotations)")
    else:
        lines.append(f"  Pending: {row.reason or 'not examined by the binder yet'}")
    labels = pod["metadata"].get("labels") or {}
    if labels.get(MAP_LABEL):  # a label value is a name, or no map at all
        try:
            cm = kube.get(CONFIGMAPS.item(labels[MAP_LABEL], namespace))
            text = (cm["metadata"].get("annotations") or {}).get(STATUS_ANNOTATION)
            if text:
                status = MapStatus.from_json(text)
                lines.append(
                    f"  map {namespace}/{labels[MAP_LABEL]}: {status.phase.value}: {status.message}"
                )
        except APINotFoundError:
            lines.append(f"  map {namespace}/{labels[MAP_LABEL]}: no such placement ConfigMap")
    events = kube.get(EVENTS.collection(namespace), fieldSelector=f"involvedObject.name={name}")[
        "items"
    ]
    for event in sorted(events, key=lambda e: e.get("lastTimestamp") or "")[-5:]:
        lines.append(f"  event {event.get('type')} {event.get('reason')}: {event.get('message')}")
    return "\n".join(lines)


def placed_by(annotations: dict[str, str]) -> str:
    """Which commit and file of the map placed the pod, as its Binding recorded them."""
    revision = annotations.get(REVISION_ANNOTATION, "")
    file = annotations.get(SOURCE_FILE_ANNOTATION, "")
    if not revision and not file:
        return "unknown revision (the map's source stamps none)"
    where = f" ({file})" if file else ""
    return f"revision {revision or 'unknown'}{where}"


def dumps(rows: Iterable[PodRow]) -> str:
    return json.dumps([r.__dict__ for r in rows], indent=2)
