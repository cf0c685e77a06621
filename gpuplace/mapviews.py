"""The placement maps of a cluster in both forms, as `gpuplace status` and `explain` show them.

A map is a labelled ConfigMap (its verdict in the annotation `gpuplace.io/status`) or a
PlacementMap custom resource (its verdict in `status`, read with `status_from_resource`). Where
both exist with the same content the custom resource serves the map and the ConfigMap's status
says it is superseded. A cluster without the CRD answers 404 to the custom resources' list: it
has ConfigMaps only.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from controller.sources import Form
from kubeio.client import Kube, Obj
from kubeio.errors import APINotFoundError
from kubeio.paths import CONFIGMAPS, PLACEMENT_MAPS, PLACEMENT_POLICIES
from placement.annotations import PLACEMENT_MAP_LABEL, STATUS_ANNOTATION
from placement.grants import POLICY_CONFIGMAP
from placement.resource import generation
from placement.resourcestatus import status_from_resource
from placement.status import GangStatus, MapStatus

#: How a superseded ConfigMap's status message starts (controller/statuswriter.py for_form).
SUPERSEDED_PREFIX = "superseded"


@dataclass(frozen=True, slots=True)
class MapView:
    """One object that declares a map, and the verdict it carries."""

    key: str  # namespace/name
    form: Form
    status: MapStatus | None  # None: the controller has written none yet
    #: The generation of a custom resource the controller has not read yet ("" when it has, and
    #: for ConfigMaps): the status shown is the verdict on an earlier spec.
    unread_generation: int = 0

    @property
    def superseded(self) -> bool:
        """A ConfigMap whose map the custom resource of the same name serves."""
        return (
            self.form is Form.CONFIGMAP
            and self.status is not None
            and self.status.message.startswith(SUPERSEDED_PREFIX)
        )

    @property
    def phase(self) -> str:
        if self.status is None:
            return "Pending"
        return "Superseded" if self.superseded else self.status.phase.value

    @property
    def note(self) -> str:
        """The message to show: the verdict's, or why there is none for this spec yet."""
        if self.status is None:
            return "no status yet"
        if self.unread_generation:
            return f"waiting for the controller to read generation {self.unread_generation}"
        return self.status.message

    def to_json(self) -> dict[str, Any]:
        return {
            "map": self.key,
            "form": self.form.value,
            "superseded": self.superseded,
            "unreadGeneration": self.unread_generation,
            "status": json.loads(self.status.to_json()) if self.status is not None else None,
        }


def _key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def configmap_view(obj: Mapping[str, Any]) -> MapView:
    """A labelled map ConfigMap and the status annotation on it."""
    text = ((obj.get("metadata") or {}).get("annotations") or {}).get(STATUS_ANNOTATION)
    try:
        status = MapStatus.from_json(text) if text else None
    except (ValueError, KeyError, TypeError):  # not the controller's writing: no verdict
        status = None
    return MapView(_key(obj), Form.CONFIGMAP, status)


def resource_view(obj: Mapping[str, Any]) -> MapView:
    """A PlacementMap custom resource and its status."""
    data = obj.get("status")
    if not isinstance(data, dict) or "phase" not in data:
        return MapView(_key(obj), Form.RESOURCE, None)
    current = generation(obj)
    observed = data.get("observedGeneration")
    read = observed if isinstance(observed, int) else 0
    unread = current if read < current else 0
    return MapView(_key(obj), Form.RESOURCE, status_from_resource(data), unread)


def list_resources(kube: Kube) -> list[Obj]:
    """Every PlacementMap; none where the CRD is not installed (the list answers 404)."""
    try:
        items: list[Obj] = kube.get(PLACEMENT_MAPS.collection())["items"]
    except APINotFoundError:
        return []
    return items


def map_views(kube: Kube) -> list[MapView]:
    """Every map object of the cluster, by key, the custom resource before the ConfigMap."""
    selector = f"{PLACEMENT_MAP_LABEL}=true"
    configmaps = kube.get(CONFIGMAPS.collection(), labelSelector=selector)["items"]
    views = [configmap_view(cm) for cm in configmaps]
    views += [resource_view(obj) for obj in list_resources(kube)]
    return sorted(views, key=lambda v: (v.key, v.form is not Form.RESOURCE))


def serving(views: Iterable[MapView]) -> list[tuple[str, MapStatus | None]]:
    """One verdict a map: the custom resource's where one exists (it wins over a ConfigMap of
    the same name), else the ConfigMap's."""
    out: dict[str, MapStatus | None] = {}
    for view in sorted(views, key=lambda v: (v.key, v.form is not Form.RESOURCE)):
        out.setdefault(view.key, view.status)
    return sorted(out.items(), key=lambda x: x[0])


def views_rows(views: Iterable[MapView]) -> list[tuple[str, ...]]:
    """The rows of `gpuplace status`'s map table (headers: VIEW_HEADERS)."""
    rows = []
    for v in views:
        s = v.status
        counts: tuple[str, ...] = ("-",) * 5
        if s is not None and not v.superseded:
            slots = s.slots
            counts = tuple(
                str(n)
                for n in (slots.total, slots.bound, slots.drifted, slots.blocked, slots.renumbered)
            )
        rows.append((v.key, v.phase, *counts, v.form.value, v.note[:100]))
    return rows


VIEW_HEADERS = (
    "MAP",
    "PHASE",
    "SLOTS",
    "BOUND",
    "DRIFTED",
    "BLOCKED",
    "RENUMBERED",
    "FORM",
    "MESSAGE",
)


def views_of(kube: Kube, namespace: str, name: str) -> list[MapView]:
    """The objects that declare map `name` in `namespace`: its custom resource, its ConfigMap
    (a ConfigMap without the map label is not one), in that order."""
    views: list[MapView] = []
    with contextlib.suppress(APINotFoundError):  # no such map, or no CRD
        views.append(resource_view(kube.get(PLACEMENT_MAPS.item(name, namespace))))
    try:
        cm = kube.get(CONFIGMAPS.item(name, namespace))
    except APINotFoundError:
        return views
    if ((cm.get("metadata") or {}).get("labels") or {}).get(PLACEMENT_MAP_LABEL) == "true":
        views.append(configmap_view(cm))
    return views


def describe(views: Sequence[MapView]) -> str:
    """What `gpuplace explain` says of a pod's map: the serving object's verdict, in a line
    ("missing" when no object declares it)."""
    if not views:
        return "missing"
    serving_first = [v for v in views if not v.superseded] + [v for v in views if v.superseded]
    view = serving_first[0]
    kind = "PlacementMap" if view.form is Form.RESOURCE else "ConfigMap"
    also = "; its ConfigMap is superseded" if view is not views[-1] and views[-1].superseded else ""
    if view.status is None or view.unread_generation:
        return f"{view.note} ({kind}{also})"
    return f"{view.phase}: {view.status.message} ({kind}{also})"


def gang_of(views: Sequence[MapView]) -> GangStatus | None:
    """The gang of the serving object's status, while the gang waits (None otherwise)."""
    serving_first = [v for v in views if not v.superseded] + [v for v in views if v.superseded]
    status = serving_first[0].status if serving_first else None
    return status.gang if status is not None else None


def placement_policy_form(kube: Kube, namespace: str = "gpuplace-system") -> Form | None:
    """Which form of the placement policy exists (the custom resource wins); None for neither."""
    with contextlib.suppress(APINotFoundError):
        kube.get(PLACEMENT_POLICIES.item(POLICY_CONFIGMAP))
        return Form.RESOURCE
    try:
        kube.get(CONFIGMAPS.item(POLICY_CONFIGMAP, namespace))
    except APINotFoundError:
        return None
    return Form.CONFIGMAP
