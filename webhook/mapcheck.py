"""Map admission: an invalid placement map is refused when it is applied, in either form.

`kubectl apply` and ArgoCD's server-side dry run then show the validator's located messages
(`configmap inference/llm placement.yaml:7:15: error: ...`), the same ones `gpuplace validate` prints.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from placement.annotations import (
    PLACEMENT_KEY,
    PLACEMENT_MAP_LABEL,
    provenance_problems,
    source_name,
)
from placement.errors import PlacementError, format_all
from placement.grants import GrantView, check_map
from placement.maps import PlacementMap
from placement.resource import map_from_resource, policy_from_resource, resource_source_name
from placement.types import MapKey
from placement.validate import parse_map_for
from webhook.review import AdmissionRequest, Verdict


def _invalid(message: str) -> Verdict:
    return Verdict.deny(message, code=422, reason="Invalid")


def check_configmap(request: AdmissionRequest, grants: GrantView | None = None) -> Verdict:
    """Validates the `placement.yaml` of a labelled ConfigMap on CREATE and UPDATE, and that its
    namespace's grants allow every node and GPU it names."""
    if request.operation not in ("CREATE", "UPDATE") or request.sub_resource:
        return Verdict(True)
    obj: Mapping[str, Any] = request.object or {}
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    labels = meta.get("labels")
    # The objectSelector also matches an UPDATE whose old object had the label: a ConfigMap
    # that stops being a placement map is not ours to judge.
    if not isinstance(labels, dict) or labels.get(PLACEMENT_MAP_LABEL) != "true":
        return Verdict(True)
    namespace = request.namespace or str(meta.get("namespace") or "")
    name = request.name or str(meta.get("name") or "")
    key = MapKey(namespace, name)
    data = obj.get("data")
    data = data if isinstance(data, dict) else {}
    text = data.get(PLACEMENT_KEY)
    if not isinstance(text, str):
        binary = obj.get("binaryData")
        where = (
            " (it is under binaryData; use data)"
            if isinstance(binary, dict) and PLACEMENT_KEY in binary
            else ""
        )
        return _invalid(
            f"configmap {key}: label {PLACEMENT_MAP_LABEL}=true is set but data has no key "
            f"{PLACEMENT_KEY!r}{where}; put the PlacementMap YAML under data.{PLACEMENT_KEY}, "
            f"or remove the label"
        )
    refused = _refused_provenance(request, meta, f"configmap {key}")
    if refused is not None:
        return refused
    if request.operation == "UPDATE" and _same_map(request.old_object, text):
        # Only metadata changed, such as the controller's status annotation, which it rewrites
        # as pods bind: parsing the map again on each of those writes would cost the webhook
        # (and the pods waiting on its threads) more than all pod admissions, and refusing one
        # would keep the controller from reporting that a map applied while this webhook was
        # down is invalid.
        return Verdict(True)
    return _judged(lambda: parse_map_for(text, source_name(key), key), grants)


def _judged(read: Callable[[], PlacementMap], grants: GrantView | None) -> Verdict:
    """The verdict on the map `read` returns: refused if it raises, or if the namespace's
    grants do not allow all of it; admitted with its warnings otherwise."""
    try:
        pmap = read()
    except PlacementError as exc:
        return _invalid(exc.format())
    denied = check_map(grants, pmap) if grants is not None else []
    if denied:
        return Verdict.deny(format_all(denied), code=403, reason="Forbidden")
    return Verdict(True, warnings=tuple(w.format() for w in pmap.warnings))


def _refused_provenance(
    request: AdmissionRequest, meta: Mapping[str, Any], source: str
) -> Verdict | None:
    """The denial of a map whose provenance annotations are longer than they may be: those the
    request sets or changes (an object that already carries one keeps taking other writes, such
    as the controller's status, which says why the map is not served)."""
    annotations = meta.get("annotations")
    if not isinstance(annotations, dict):
        return None
    before: Mapping[str, Any] | None = None
    if request.operation == "UPDATE":
        old_meta = (request.old_object or {}).get("metadata")
        old_annotations = old_meta.get("annotations") if isinstance(old_meta, dict) else None
        before = old_annotations if isinstance(old_annotations, dict) else {}
    refused = provenance_problems(annotations, source, before)
    return _invalid(format_all(refused)) if refused else None


def _same_map(old: Mapping[str, Any] | None, text: str) -> bool:
    """Whether the old object was already this placement map (label set, same text)."""
    if not isinstance(old, dict):
        return False
    meta = old.get("metadata")
    labels = meta.get("labels") if isinstance(meta, dict) else None
    data = old.get("data")
    return (
        isinstance(labels, dict)
        and labels.get(PLACEMENT_MAP_LABEL) == "true"
        and isinstance(data, dict)
        and data.get(PLACEMENT_KEY) == text
    )


def check_resource(request: AdmissionRequest, grants: GrantView | None = None) -> Verdict:
    """Validates a PlacementMap custom resource on CREATE and UPDATE beyond what its schema can
    (indices, devices, nodes, legacy text, grants); a denial names the field path."""
    if request.operation not in ("CREATE", "UPDATE") or request.sub_resource:
        return Verdict(True)
    obj = _with_namespace(request)
    meta = obj["metadata"]
    key = MapKey(str(meta.get("namespace") or ""), str(meta.get("name") or ""))
    refused = _refused_provenance(request, meta, resource_source_name(key))
    if refused is not None:
        return refused
    old = request.old_object
    if (
        request.operation == "UPDATE"
        and isinstance(old, dict)
        and old.get("spec") == obj.get("spec")
    ):
        return Verdict(True)  # metadata only: the map did not change
    return _judged(lambda: map_from_resource(obj), grants)


def check_policy_resource(request: AdmissionRequest) -> Verdict:
    """Validates the PlacementPolicy custom resource beyond its schema (node names, selectors,
    devices), naming the field path."""
    if request.operation not in ("CREATE", "UPDATE") or request.sub_resource:
        return Verdict(True)
    try:
        policy_from_resource(request.object or {})
    except PlacementError as exc:
        return _invalid(exc.format())
    return Verdict(True)


def _with_namespace(request: AdmissionRequest) -> dict[str, Any]:
    """The object, with the request's namespace and name where its metadata lacks them."""
    obj = dict(request.object or {})
    meta = obj.get("metadata")
    meta = dict(meta) if isinstance(meta, dict) else {}
    meta.setdefault("namespace", request.namespace)
    if not meta.get("name"):
        meta["name"] = request.name
    obj["metadata"] = meta
    return obj
