"""What `gpuplace status`, `gpuplace explain` and the demo show: read from any cluster."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpuplace import mapviews
from kubeio.client import Kube
from kubeio.errors import APINotFoundError
from kubeio.paths import CONFIGMAPS, EVENTS, PODS
from kubeio.pod import Condition, Pod
from placement import podmeta
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
    RENUMBERED_CONDITION,
    REVISION_ANNOTATION,
    SOURCE_FILE_ANNOTATION,
    UNVERIFIABLE_CONDITION,
)
from placement.errors import PlacementError
from placement.inventory import INVENTORY_KEY, INVENTORY_NAMESPACE, NodeInventory
from placement.legacy import PodLine, shared_gpus
from placement.migprofiles import MIG_PREFIX
from placement.status import MapStatus

_FIELD_REF = re.compile(r"^metadata\.annotations\['([^']+)'\]$")


def table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    rows = [list(map(str, r)) for r in rows]
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
    out = [line.rstrip()]
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return "\n".join(out)


def container_env(pod: Pod, name: str, container: int = 0) -> str:
    """The value a container will see for env var `name`: literal, or resolved like the kubelet
    resolves an annotation fieldRef (empty when the pod is not bound yet)."""
    containers = (pod.obj.get("spec") or {}).get("containers") or []
    if len(containers) <= container:
        return ""
    for env in containers[container].get("env") or []:
        if env.get("name") != name:
            continue
        if "value" in env:
            return str(env["value"])
        path = (env.get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath", "")
        match = _FIELD_REF.match(path)
        return str(pod.annotations.get(match.group(1), "")) if match else f"<{path}>"
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
    def of(cls, pod: Pod) -> PodRow:
        ann = pod.annotations
        map_name = (
            podmeta.map_name_of(pod)
            or ann.get(MAP_ANNOTATION)
            or ("(legacy)" if LEGACY_ANNOTATION in ann else "")
        )
        return cls(
            pod.namespace,
            pod.name,
            map_name,
            ann.get(INDEX_ANNOTATION, ""),
            pod.node_name,
            ann.get(DEVICES_ANNOTATION, ""),
            container_env(pod, ENV_CUDA_VISIBLE_DEVICES),
            pod.phase,
            _reason(pod),
        )


def _reason(pod: Pod) -> str:
    """Why a pending pod waits, or what is wrong with a bound one (the last that applies)."""
    reason = ""
    if not pod.bound:
        waits = pod.condition("PodScheduled", status="False")
        return f"{waits.reason}: {waits.message}" if waits is not None else ""
    drifted = pod.condition(DRIFTED_CONDITION)
    if drifted is not None:
        reason = f"Drifted ({drifted.reason}): {drifted.message}"
    renumbered = pod.condition(RENUMBERED_CONDITION)
    if renumbered is not None:
        reason = f"DevicesRenumbered: {renumbered.message}"
    unverifiable = pod.condition(UNVERIFIABLE_CONDITION)
    if unverifiable is not None:
        reason = f"BindingUnverifiable: {unverifiable.message}"
    prebound = prebound_line(pod)
    if prebound is not None:
        reason = (
            f"bound by {pod.scheduler_name} (cut-over): holds GPUs "
            f"{prebound} of its {LEGACY_ANNOTATION} line"
        )
    return reason


def _legacy_line(pod: Pod) -> PodLine | None:
    """The pod's own legacy line, or None where it has none or the text is broken."""
    try:
        return podmeta.legacy_line(pod)
    except PlacementError:
        return None


def prebound_line(pod: Pod) -> str | None:
    """The devices of a pod bound by the earlier tools (legacy line, no gpuplace binding)."""
    line = podmeta.prebound_line(pod) if pod.bound else None
    entry = line.entry if line is not None else None
    return None if entry is None else ",".join(map(str, entry.devices))


def gpuplace_pods(kube: Kube, scheduler_names: Sequence[str]) -> list[PodRow]:
    rows: list[PodRow] = []
    for name in scheduler_names:
        items = kube.get(PODS.collection(), fieldSelector=f"spec.schedulerName={name}")["items"]
        rows.extend(PodRow.of(Pod.of(p)) for p in items)
    return sorted(rows, key=lambda r: (r.namespace, r.name))


def mig_inventories(
    kube: Kube, rows: Iterable[PodRow], namespace: str = INVENTORY_NAMESPACE
) -> dict[str, NodeInventory]:
    """The inventories of the nodes where a pod holds a MIG instance (none listed if no pod does),
    for `pod_table` to show each instance's parent and profile."""
    nodes = {r.node for r in rows if MIG_PREFIX in r.devices}
    if not nodes:
        return {}
    return {i.node: i for i in _inventories(kube, namespace) if i.node in nodes}


POD_HEADERS = (
    "NAMESPACE",
    "POD",
    "MAP",
    "INDEX",
    "NODE",
    "GPU UUIDS",
    "CUDA_VISIBLE_DEVICES",
    "PHASE",
    "REASON",
)


def pod_table(
    rows: Iterable[PodRow], inventories: Mapping[str, NodeInventory] | None = None
) -> str:
    """The pods; a MIG instance as `gpu 0 / 3g.40gb (MIG-…)` where `inventories` has its node."""
    return table(POD_HEADERS, pod_cells(rows, inventories))


def pod_cells(
    rows: Iterable[PodRow], inventories: Mapping[str, NodeInventory] | None = None
) -> list[tuple[str, ...]]:
    """The rows of `pod_table` (headers: POD_HEADERS)."""
    invs = inventories or {}

    def devices(row: PodRow) -> str:
        inventory = invs.get(row.node)
        if inventory is None:
            return row.devices
        return ",".join(mig_shown(inventory, d) for d in row.devices.split(",") if d)

    return [
        (
            r.namespace,
            r.name,
            r.map,
            r.index,
            r.node or "-",
            devices(r) or "-",
            r.cuda_visible_devices or "-",
            r.phase,
            r.reason or "-",  # last column, in full: it names what the pod waits for
        )
        for r in rows
    ]


def map_statuses(kube: Kube) -> list[tuple[str, MapStatus | None]]:
    """One verdict a map, from the object that serves it: its PlacementMap custom resource where
    one exists, else its ConfigMap (gpuplace/mapviews.py has every object and its form)."""
    return mapviews.serving(mapviews.map_views(kube))


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
    """Whether the placement policy exists, as the custom resource or as the ConfigMap."""
    return mapviews.placement_policy_form(kube, namespace) is not None


def shown_gpus(kube: Kube, node: str, devices: str, namespace: str = INVENTORY_NAMESPACE) -> str:
    """A binding's devices as people read them: a MIG instance as `gpu 0 / 3g.40gb (MIG-…)`, its
    parent and profile taken from the node's inventory (whole GPUs as they are)."""
    uuids = [d for d in devices.split(",") if d]
    if not any(u.startswith(MIG_PREFIX) for u in uuids):
        return devices
    inventory = next((i for i in _inventories(kube, namespace) if i.node == node), None)
    return ",".join(mig_shown(inventory, u) for u in uuids)


def mig_shown(inventory: NodeInventory | None, uuid: str) -> str:
    instance = inventory.mig_by_uuid.get(uuid) if inventory is not None else None
    parent = inventory.mig_parent.get(uuid) if inventory is not None else None
    if instance is None or parent is None:
        return uuid
    return f"gpu {parent.index} / {instance.profile} ({uuid})"


def _inventories(kube: Kube, namespace: str) -> list[NodeInventory]:
    out: list[NodeInventory] = []
    for cm in kube.get(CONFIGMAPS.collection(namespace))["items"]:
        text = (cm.get("data") or {}).get(INVENTORY_KEY)
        if text is None:
            continue
        try:
            out.append(NodeInventory.from_json(text))
        except ValueError:
            continue
    return out


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


def _provenance(pod: Pod) -> list[str]:
    """Where the binding came from: a placement map's model generation, or (legacy pods) the
    pod's own gpu-scheduling-map line, which no model generation describes."""
    ann = pod.annotations
    if not ann.get(MAP_ANNOTATION, "").startswith(LEGACY_MAP_PREFIX):
        return [f"  model generation: {ann.get(GENERATION_ANNOTATION, '?')}"]
    out = [
        f"  legacy mode: placed by line {ann.get(INDEX_ANNOTATION, '?')} of the pod's own "
        f"{LEGACY_ANNOTATION} annotation (no placement map, so no model generation applies)"
    ]
    line = _legacy_line(pod)
    for shared in shared_gpus(line.entries if line is not None else ()):
        if line is not None and line.index in shared.indices:
            out.append(f"  {shared.describe()}")
    return out


@dataclass(frozen=True)
class Explanation:
    """Why a pod is where it is, or why it is Pending: the data of `gpuplace explain` (its JSON
    and YAML outputs), and the lines of its text."""

    pod: str
    phase: str
    node: str
    by_gpuplace: bool  # bound through a gpuplace Binding (its annotations)
    map: str
    index: str
    gpus: str
    cuda_visible_devices: str
    provenance: tuple[str, ...]  # model generation, or the legacy line it came from
    placed_by: str  # revision and file of the map, "" for legacy pods
    drifted: Condition | None
    unverifiable: Condition | None
    pending: str  # why it waits, when not bound
    #: "<phase>: <message> (<form>)" of the object that serves the pod's map (mapviews.describe),
    #: "missing", or "" for a pod without a map.
    map_status: str
    events: tuple[dict[str, str], ...]  # the last five: type, reason, message
    #: How the pod's gang stands while it waits (its map's status, GangStatus.describe), e.g.
    #: "gang: 3 of 4 ranks ready; slot 3 waits NodeCordoned"; "" for a map whose gang does not
    #: wait, or that is not a gang.
    gang: str = ""

    def lines(self) -> list[str]:
        out = [f"pod {self.pod}"]
        if self.node and self.by_gpuplace:
            out.append(
                f"  bound to node {self.node} by gpuplace: map {self.map} index {self.index}"
            )
            out.append(f"  GPUs: {self.gpus or '(indices only)'}")
            out.append(f"  CUDA_VISIBLE_DEVICES in the container: {self.cuda_visible_devices}")
            out.extend(f"  {line}" for line in self.provenance)
            if self.placed_by:
                out.append(f"  placed by: {self.placed_by}")
            if self.drifted is not None:
                out.append(f"  Drifted ({self.drifted.reason}): {self.drifted.message}")
            if self.unverifiable is not None:
                out.append(f"  BindingUnverifiable: {self.unverifiable.message}")
        elif self.node:
            out.append(f"  bound to node {self.node}, not by gpuplace (no placement annotations)")
        else:
            out.append(f"  Pending: {self.pending or 'not examined by the binder yet'}")
        if self.gang:
            out.append(f"  {self.gang}")
        namespace = self.pod.split("/", 1)[0]
        if self.map_status == "missing":
            out.append(f"  map {namespace}/{self.map}: no such PlacementMap or placement ConfigMap")
        elif self.map_status:
            out.append(f"  map {namespace}/{self.map}: {self.map_status}")
        for event in self.events:
            out.append(f"  event {event['type']} {event['reason']}: {event['message']}")
        return out

    def to_dict(self) -> dict[str, object]:
        data = dataclasses.asdict(self)
        return {_camel(k): v for k, v in data.items()}


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def explanation(kube: Kube, namespace: str, name: str) -> Explanation | None:
    """The pod's explanation; None when there is no such pod."""
    try:
        pod = Pod.of(kube.get(PODS.item(name, namespace)))
    except (APINotFoundError, ValueError):  # ValueError: no such name can exist (".", "")
        return None
    row = PodRow.of(pod)
    ann = pod.annotations
    by_gpuplace = bool(row.node) and CUDA_ANNOTATION in ann
    legacy = ann.get(MAP_ANNOTATION, "").startswith(LEGACY_MAP_PREFIX)
    map_name = podmeta.map_name_of(pod) or ""
    map_status = gang = ""
    if map_name:  # a label value is a name, or no map at all
        views = mapviews.views_of(kube, namespace, map_name)
        map_status = mapviews.describe(views)
        standing = mapviews.gang_of(views)
        gang = standing.describe() if standing is not None and standing.waiting else ""
    events = kube.get(EVENTS.collection(namespace), fieldSelector=f"involvedObject.name={name}")[
        "items"
    ]
    last = sorted(events, key=lambda e: e.get("lastTimestamp") or "")[-5:]
    return Explanation(
        pod=f"{namespace}/{name}",
        phase=pod.phase,
        node=row.node,
        by_gpuplace=by_gpuplace,
        map=map_name or row.map,
        index=row.index,
        gpus=shown_gpus(kube, row.node, row.devices) if row.node else row.devices,
        cuda_visible_devices=row.cuda_visible_devices,
        provenance=tuple(line.strip() for line in _provenance(pod)) if by_gpuplace else (),
        placed_by=placed_by(ann) if by_gpuplace and not legacy else "",
        drifted=pod.condition(DRIFTED_CONDITION) if by_gpuplace else None,
        unverifiable=pod.condition(UNVERIFIABLE_CONDITION) if by_gpuplace else None,
        pending="" if row.node else row.reason,
        map_status=map_status,
        events=tuple(
            {
                "type": str(e.get("type")),
                "reason": str(e.get("reason")),
                "message": str(e.get("message")),
            }
            for e in last
        ),
        gang=gang,
    )


def explain(kube: Kube, namespace: str, name: str) -> str:
    """Why a pod is where it is, or why it is Pending, in a few lines."""
    found = explanation(kube, namespace, name)
    if found is None:
        return f"pod {namespace}/{name} not found"
    return "\n".join(found.lines())


def placed_by(annotations: Mapping[str, str]) -> str:
    """Which commit and file of the map placed the pod, as its Binding recorded them."""
    revision = annotations.get(REVISION_ANNOTATION, "")
    file = annotations.get(SOURCE_FILE_ANNOTATION, "")
    if not revision and not file:
        return "unknown revision (the map's source stamps none)"
    where = f" ({file})" if file else ""
    return f"revision {revision or 'unknown'}{where}"


def dumps(rows: Iterable[PodRow]) -> str:
    return json.dumps([r.__dict__ for r in rows], indent=2)
