"""Source maps: parse each ConfigMap, keep its last valid version, and say what its status is.

A map that turns invalid keeps serving its last valid version; its status says Invalid, with the
located errors, and which version is still in service.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum

from kubeio.client import Obj, obj_key
from placement.annotations import (
    PLACEMENT_KEY,
    provenance_problems,
    source_name,
    source_provenance,
)
from placement.compile import MapReport
from placement.errors import Diagnostic, Location, PlacementError
from placement.maps import PlacementMap
from placement.model import Provenance
from placement.resource import generation, map_from_resource, resource_source_name, resource_version
from placement.status import COMPILING, GangStatus, MapStatus, Phase, SlotCounts, data_hash
from placement.types import MapKey
from placement.validate import parse_map_for


class Form(StrEnum):
    """Where a map is declared: a labelled ConfigMap, or a PlacementMap custom resource."""

    CONFIGMAP = "configmap"
    RESOURCE = "resource"


@dataclass(frozen=True, slots=True)
class SourceState:
    key: MapKey
    version: str  # digest of the placement.yaml last read
    valid: PlacementMap | None = None  # last valid version, still served when the current is not
    valid_version: str = ""
    errors: tuple[Diagnostic, ...] = ()
    data_hash: str = ""  # placement.status.data_hash of the text last read
    #: The valid version was rebuilt from the stored model (the source was invalid when this
    #: process started, so its text is not at hand).
    restored: bool = False
    provenance: Provenance = field(default_factory=Provenance)  # of the valid version
    form: Form = Form.CONFIGMAP
    #: metadata.generation of the object read (custom resources; 0 for ConfigMaps)
    generation: int = 0
    #: Both forms declare the map, with different content: nothing new is served until one goes
    #: or they agree (`errors` says so; `valid` is the version in service before).
    form_conflict: bool = False
    #: A digest of the provenance annotations refused when last read ("" when none was): a
    #: ConfigMap is read again when they change, though its text did not.
    refused: str = ""


def digest(text: str) -> str:
    """A map's version: the digest of its text, not the ConfigMap's resourceVersion, which every
    status patch changes (status must not feed back into what it describes)."""
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def read_source(obj: Obj, previous: SourceState | None) -> SourceState:
    key = MapKey(*obj_key(obj))
    text = (obj.get("data") or {}).get(PLACEMENT_KEY)
    version = digest(text) if text is not None else "missing"
    annotations = obj["metadata"].get("annotations") or {}
    refused = provenance_problems(annotations, f"configmap {key}")
    stamp = digest("\n".join(d.format() for d in refused)) if refused else ""
    if previous is not None and previous.version == version and previous.refused == stamp:
        return previous
    base = replace(
        previous or SourceState(key, version),
        version=version,
        data_hash=data_hash(text or ""),
        refused=stamp,
    )
    if text is None:
        error = Diagnostic(
            Location(source_name(key), 0, 0, f"data.{PLACEMENT_KEY}"),
            f"ConfigMap has no key {PLACEMENT_KEY!r}",
        )
        return replace(base, errors=(error, *refused))
    parse = functools.partial(parse_map_for, text, source_name(key), key)
    return _parsed(base, parse, annotations, refused, base.data_hash)


def read_resource(obj: Obj, previous: SourceState | None) -> SourceState:
    """The state of a PlacementMap custom resource (its spec already passed the CRD's schema)."""
    key = MapKey(*obj_key(obj))
    version = resource_version(obj)
    gen = generation(obj)
    if previous is not None and previous.version == version:
        return previous if previous.generation == gen else replace(previous, generation=gen)
    base = replace(
        previous or SourceState(key, version, form=Form.RESOURCE), version=version, generation=gen
    )
    annotations = obj["metadata"].get("annotations") or {}
    refused = provenance_problems(annotations, resource_source_name(key))
    parse = functools.partial(map_from_resource, obj)
    return _parsed(base, parse, annotations, refused, "", Form.RESOURCE, gen)


def _parsed(
    base: SourceState,
    parse: Callable[[], PlacementMap],
    annotations: Mapping[str, str],
    refused: tuple[Diagnostic, ...],
    text_hash: str,
    form: Form = Form.CONFIGMAP,
    gen: int = 0,
) -> SourceState:
    """`base` with the errors `parse` raises, or those of the provenance annotations refused;
    else a state that serves the parsed map (of `form`, its text hashed `text_hash`)."""
    try:
        pmap = parse()
    except PlacementError as exc:
        return replace(base, errors=(*exc.diagnostics, *refused))
    if refused:
        return replace(base, errors=refused)
    revision, file = source_provenance(annotations)
    provenance = Provenance(revision, file)
    return SourceState(
        base.key, base.version, pmap, base.version, (), text_hash, False, provenance, form, gen
    )


def merge(forms: Mapping[Form, SourceState], previous: SourceState | None) -> SourceState:
    """The state a map is served from when it is declared in one form or both. Both, with the
    same content: the custom resource (a migration's middle state). Both, differing: a conflict
    that serves what was served before, never a silent pick."""
    resource = forms.get(Form.RESOURCE)
    configmap = forms.get(Form.CONFIGMAP)
    if resource is None or configmap is None:
        only = resource or configmap
        assert only is not None, "merge needs at least one form"
        return only
    if same_content(resource, configmap):
        return resource
    kept = previous if previous is not None and previous.valid is not None else None
    error = Diagnostic(
        Location(resource_source_name(resource.key)),
        f"ConfigMap {configmap.key} declares this map with other content",
        hint="a map is declared once: delete one of the two, or make them equal",
    )
    return replace(
        resource,
        valid=kept.valid if kept else None,
        valid_version=kept.valid_version if kept else "",
        provenance=kept.provenance if kept else Provenance(),
        restored=kept.restored if kept else False,
        errors=(error, *resource.errors),
        form_conflict=True,
    )


def same_content(a: SourceState, b: SourceState) -> bool:
    """Whether two forms declare the same valid map (locations and sources aside)."""
    return not a.errors and not b.errors and a.valid is not None and a.valid == b.valid


def restore(
    state: SourceState, pmap: PlacementMap, version: str, provenance: Provenance
) -> SourceState:
    """A source with no valid version of its own (invalid since this process started) serves
    the version the stored model holds."""
    return replace(state, valid=pmap, valid_version=version, restored=True, provenance=provenance)


def map_status(
    state: SourceState,
    report: MapReport | None,
    generation: int,
    bound: int,
    drifted: int = 0,
    revision: str = "",
    rollout: str = "",
    renumbered: int = 0,
    unverifiable: int = 0,
    gang: GangStatus | None = None,
) -> MapStatus:
    total = report.total if report else 0
    served = report.served if report else 0
    counts = SlotCounts(
        total=total,
        served=served,
        bound=bound,
        blocked=total - served,
        drifted=drifted,
        renumbered=renumbered,
        unverifiable=unverifiable,
    )
    extra = {"observed_data_hash": state.data_hash, "revision": revision, "rollout": rollout}
    warnings = state.valid.warnings if state.valid is not None else ()
    if state.errors:
        serving = (
            f"; still serving version {state.valid_version}"
            if state.valid is not None
            else "; nothing served"
        )
        if state.valid is not None and state.restored:
            serving += " (restored from the stored model)"
        first = state.errors[0].format()
        return MapStatus(
            Phase.CONFLICT if state.form_conflict else Phase.INVALID,
            generation,
            state.version,
            f"{len(state.errors)} error(s): {first}{serving}",
            state.errors,
            counts,
            state.valid_version,
            warnings,
            **extra,
            gang=gang,
        )
    if report is None:
        return MapStatus(
            Phase.VALID,
            generation,
            state.version,
            COMPILING,
            (),
            counts,
            state.valid_version,
            warnings,
            **extra,
            gang=gang,
        )
    message = report.message
    if warnings:
        message += f"; {len(warnings)} warning(s): {warnings[0].format()}"
    if drifted:
        message += f"; {drifted} pod(s) drifted"
    if renumbered:
        message += (
            f"; {renumbered} pod(s) on renumbered GPUs (their CUDA_VISIBLE_DEVICES indices now "
            "name other GPUs: delete them to rebind)"
        )
    if unverifiable:
        message += (
            f"; {unverifiable} pod(s) bound under a binding key the key ring no longer holds "
            "(their GPUs stay blocked: `gpuplace key adopt` re-adopts them)"
        )
    if gang is not None and gang.waiting:
        message += f"; {gang.describe()}"
    return MapStatus(
        report.phase,
        generation,
        state.version,
        message,
        (),
        counts,
        state.valid_version,
        warnings,
        **extra,
        gang=gang,
    )


def only_bound_changed(before: MapStatus, after: MapStatus) -> bool:
    """Whether two statuses differ in the bound-slot count alone: the one figure that moves with
    every pod bound or deleted, and so the one worth coalescing."""
    return (
        before != after
        and replace(after, slots=replace(after.slots, bound=before.slots.bound)) == before
    )
