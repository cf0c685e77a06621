"""Validation of PlacementMap documents into `PlacementMap`s, with compiler-style locations.

Structure and types are checked by the pydantic schema; the rules that relate fields to each other
are checked here, where each can point at the exact entry and device.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from placement.errors import Diagnostic, Location, PlacementError, oversized
from placement.indexing import RankRules
from placement.legacy import LegacyEntry, parse_legacy, shared_gpus
from placement.maps import DeclaredSlot, Gang, MigRequest, PlacementMap, Requirement, Rollout
from placement.migprofiles import product_problem, profile_form_problem
from placement.schema import (
    EXPECTED_API_VERSION,
    MapSpec,
    PlacementMapDocument,
    PlacementSpec,
    is_placement_document,
)
from placement.types import (
    DNS_LABEL_RE,
    GPU_UUID_RE,
    KIND,
    MAX_DEVICE_INDEX,
    MAX_MAP_TEXT,
    DeviceRef,
    GpuUuid,
    MapKey,
    Sharing,
    is_node_ref,
    pci_bus_id,
)
from placement.yamlsource import Document, Path, format_path, load_documents

_KNOWN_FIELDS = (
    "apiVersion",
    "kind",
    "metadata",
    "spec",
    "name",
    "namespace",
    "labels",
    "annotations",
    "sharing",
    "indexing",
    "envMode",
    "placements",
    "map",
    "rollout",
    "strategy",
    "maxUnavailable",
    "index",
    "node",
    "devices",
    "count",
    "require",
    "product",
    "minMemoryMiB",
    "mig",
    "gpu",
    "profile",
    "fallback",
    "nvlink",
    "sameClique",
    "indexLabel",
    "podsPerJob",
    "gang",
    "timeoutSeconds",
)
_TYPE_NAMES = {
    "int_type": "an integer",
    "int_parsing": "an integer",
    "string_type": "a string",
    "list_type": "a list",
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
    "bool_type": "a boolean",
}


@dataclass(slots=True)
class LoadResult:
    """The maps found in one source and the problems found in it (both may be non-empty)."""

    maps: list[PlacementMap] = field(default_factory=list)
    diagnostics: list[Diagnostic] = field(default_factory=list)
    other_documents: int = 0


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    kind = {
        bool: "boolean",
        int: "integer",
        float: "number",
        str: "string",
        list: "list",
        dict: "mapping",
    }.get(type(value), type(value).__name__)
    if isinstance(value, list | dict):
        return kind
    shown = repr(value)
    return f"{kind} {shown[:40]}{'...' if len(shown) > 40 else ''}"


def _error_path(doc: Document, error: ErrorDetails) -> Path:
    """The part of pydantic's `loc` that names a real place in the document."""
    raw_loc = tuple(error["loc"])
    path: Path = ()
    for part in raw_loc:
        candidate = (*path, part)
        # Mapping keys that YAML read as numbers are recorded under their text.
        spelled = (*path, str(part))
        if _exists(doc, candidate):
            path = candidate
        elif _exists(doc, spelled):
            path = spelled
        elif error["type"] in ("missing", "extra_forbidden") and part == raw_loc[-1]:
            path = candidate
        else:
            # Union members add their type name to `loc`.
            break
    return path


def _exists(doc: Document, path: Path) -> bool:
    """Whether `path` names a value or key of the document (walked, when it has no positions)."""
    if doc.positioned:
        return path in doc.values or path in doc.keys
    value: Any = doc.value
    for part in path:
        in_list = isinstance(value, list) and isinstance(part, int) and 0 <= part < len(value)
        if not (in_list or (isinstance(value, dict) and part in value)):
            return False
        value = value[part]
    return True


def _bound_message(name: str, error: ErrorDetails) -> str:
    ctx = error.get("ctx", {})
    value = error.get("input")
    kind = error["type"]
    if kind == "greater_than_equal":
        bound = ctx.get("ge")
        return (
            f"{name} {value} is negative" if bound == 0 else f"{name} {value} is less than {bound}"
        )
    if kind == "less_than_equal":
        return f"{name} {value} is larger than {ctx.get('le')}"
    if kind == "string_too_short":
        return f"{name} must not be empty"
    if kind == "string_too_long":
        return f"{name} is longer than {ctx.get('max_length')} characters"
    if kind == "enum":
        return f"{name} must be {ctx.get('expected')}, got {_describe(value)}"
    msg = str(error["msg"])
    return msg[0].lower() + msg[1:] if msg else kind


def _pydantic_diagnostics(doc: Document, exc: ValidationError) -> list[Diagnostic]:
    located = [(_error_path(doc, error), error) for error in exc.errors()]
    # A value that fits no member of a union (`devices: [1.5]`) gets one message naming them all.
    expected: dict[Path, list[str]] = {}
    for path, error in located:
        if error["type"] in _TYPE_NAMES:
            names = expected.setdefault(path, [])
            if _TYPE_NAMES[error["type"]] not in names:
                names.append(_TYPE_NAMES[error["type"]])
    out: list[Diagnostic] = []
    for path, error in located:
        if error["type"] in _TYPE_NAMES:
            if path not in expected:
                continue
            out.append(_diagnostic(doc, path, error, expected.pop(path)))
        else:
            out.append(_diagnostic(doc, path, error, []))
    return out


def _diagnostic(doc: Document, path: Path, error: ErrorDetails, names: list[str]) -> Diagnostic:
    kind = error["type"]
    last = str(path[-1]) if path else ""
    if kind == "missing":
        loc = doc.locate(path[:-1])
        return Diagnostic(
            Location(loc.source, loc.line, loc.column, format_path(path)),
            f"missing required field '{last}'",
        )
    if kind == "extra_forbidden":
        close = difflib.get_close_matches(last, _KNOWN_FIELDS, n=1)
        return Diagnostic(
            doc.locate(path, key=True),
            f"unknown field '{last}'",
            hint=f"did you mean '{close[0]}'?" if close else "",
        )
    if kind in _TYPE_NAMES:
        value = error.get("input")
        # YAML 1.1 reads an unquoted 0000:18:00.0 as a base-60 number.
        unquoted_pci = isinstance(value, float) and any(
            str(p) in ("devices", "fallback", "gpu") for p in path
        )
        return Diagnostic(
            doc.locate(path),
            f"expected {' or '.join(names)}, got {_describe(value)}",
            hint='quote a PCI bus ID ("0000:18:00.0"): unquoted, YAML reads it as a number'
            if unquoted_pci
            else "",
        )
    return Diagnostic(doc.locate(path), _bound_message(last, error))


def _check_device(doc: Document, path: Path, raw: object) -> DeviceRef | Diagnostic:
    if isinstance(raw, int):
        if raw < 0:
            return Diagnostic(doc.locate(path), f"device index {raw} is negative")
        if raw > MAX_DEVICE_INDEX:
            return Diagnostic(
                doc.locate(path), f"device index {raw} is larger than {MAX_DEVICE_INDEX}"
            )
        return raw
    text = str(raw)
    if GPU_UUID_RE.match(text):
        return GpuUuid(text)
    pci = pci_bus_id(text)
    if pci is not None:
        # Named by its slot: the inventory resolves it to the GPU there (NodeInventory.find).
        return GpuUuid(pci)
    return Diagnostic(
        doc.locate(path),
        f"device {text!r} is neither an NVML index, a GPU UUID nor a PCI bus ID",
        hint="use an index like 0, a UUID like GPU-5c1d0c3e-8c6a-4f4e-9a1b-2f6e7d8c9b0a or a "
        "PCI bus ID like 00000000:18:00.0",
    )


def _entry_slots(
    doc: Document, entries: list[PlacementSpec]
) -> tuple[list[DeclaredSlot], list[Diagnostic]]:
    slots: list[DeclaredSlot] = []
    errors: list[Diagnostic] = []
    for i, entry in enumerate(entries):
        base: Path = ("spec", "placements", i)
        problem = _entry_problem(doc, base, entry)
        if problem is not None:
            errors.append(problem)
            continue
        devices = _entry_devices(doc, base, entry.devices or [], errors)
        require = None
        if entry.require is not None:
            require = Requirement(
                entry.require.product, entry.require.min_memory_mib, bool(entry.require.nvlink)
            )
        mig = _entry_mig(doc, base, entry, errors)
        slots.append(
            DeclaredSlot(
                entry.index,
                entry.node,
                tuple(devices),
                entry.count,
                require,
                doc.locate(base),
                tolerations=tuple(t.toleration() for t in entry.tolerations or ()),
                toleration_locations=tuple(
                    doc.locate((*base, "tolerations", j))
                    for j in range(len(entry.tolerations or ()))
                ),
                mig=mig,
                fallback=tuple(_entry_fallback(doc, base, entry, devices, errors)),
            )
        )
    return slots, errors


def _entry_fallback(
    doc: Document,
    base: Path,
    entry: PlacementSpec,
    devices: list[DeviceRef],
    errors: list[Diagnostic],
) -> list[DeviceRef]:
    """The entry's spare devices, well-formed, each once and none of its own devices; a problem
    goes to `errors`."""
    if entry.fallback is None:
        return []
    path = (*base, "fallback")
    if entry.devices is None:
        errors.append(
            Diagnostic(
                doc.locate(path, key=True),
                "'fallback' needs 'devices'",
                hint="spares stand in for devices the entry names; a 'count' entry picks "
                "among every healthy GPU anyway",
            )
        )
        return []
    spares: list[DeviceRef] = []
    seen: dict[DeviceRef, int] = {}
    for j, raw in enumerate(entry.fallback):
        fpath = (*path, j)
        checked = _check_device(doc, fpath, raw)
        if isinstance(checked, Diagnostic):
            errors.append(checked)
        elif checked in seen:
            first = doc.locate((*path, seen[checked]))
            errors.append(
                Diagnostic(
                    doc.locate(fpath),
                    f"fallback device {checked} listed twice (first at {first.within()})",
                )
            )
        elif checked in devices:
            errors.append(
                Diagnostic(
                    doc.locate(fpath),
                    f"fallback device {checked} is one of the entry's own devices",
                    hint="a spare must be another GPU of the node",
                )
            )
        else:
            seen[checked] = j
            spares.append(checked)
    return spares


def _entry_mig(
    doc: Document, base: Path, entry: PlacementSpec, errors: list[Diagnostic]
) -> MigRequest | None:
    """The entry's MIG instance request, its parent and profile checked (the profile against
    `require.product` where the map names one); a problem goes to `errors`."""
    if entry.mig is None:
        return None
    path = (*base, "mig")
    gpu = _check_device(doc, (*path, "gpu"), entry.mig.gpu)
    if isinstance(gpu, Diagnostic):
        errors.append(gpu)
        return None
    profile = entry.mig.profile
    problem = profile_form_problem(profile)
    if problem is None and entry.require is not None and entry.require.product:
        problem = product_problem(profile, entry.require.product)
    if problem is not None:
        errors.append(Diagnostic(doc.locate((*path, "profile")), problem))
        return None
    return MigRequest(gpu, profile)


def _entry_problem(doc: Document, base: Path, entry: PlacementSpec) -> Diagnostic | None:
    """What makes the entry at `base` unusable as a whole: how it names its GPUs, or its node."""
    if entry.mig is not None and (entry.devices is not None or entry.count is not None):
        other = "devices" if entry.devices is not None else "count"
        return Diagnostic(
            doc.locate((*base, "mig"), key=True),
            f"'mig' and '{other}' are mutually exclusive",
            hint="a slot gets one MIG instance, or whole GPUs",
        )
    if entry.devices is not None and entry.count is not None:
        return Diagnostic(
            doc.locate((*base, "count"), key=True),
            "'devices' and 'count' are mutually exclusive",
            hint="list the devices, or let the controller pick 'count' of them",
        )
    if entry.devices is None and entry.count is None and entry.mig is None:
        return Diagnostic(
            doc.locate(base), f"placement index {entry.index} needs 'devices', 'count' or 'mig'"
        )
    if not is_node_ref(entry.node):
        return Diagnostic(
            doc.locate((*base, "node")),
            f"node {entry.node!r} is not a valid node name or label value",
        )
    if entry.devices is not None and not entry.devices:
        return Diagnostic(
            doc.locate((*base, "devices")),
            "empty device list",
            hint="list at least one device, or use 'count'",
        )
    return None


def _entry_devices(
    doc: Document, base: Path, raws: list[int | str], errors: list[Diagnostic]
) -> list[DeviceRef]:
    """The entry's well-formed devices, each once; a problem with any other goes to `errors`."""
    devices: list[DeviceRef] = []
    seen: dict[DeviceRef, int] = {}
    for j, raw in enumerate(raws):
        dpath = (*base, "devices", j)
        checked = _check_device(doc, dpath, raw)
        if isinstance(checked, Diagnostic):
            errors.append(checked)
            continue
        if checked in seen:
            first = doc.locate((*base, "devices", seen[checked]))
            errors.append(
                Diagnostic(
                    doc.locate(dpath),
                    f"device {checked} listed twice in this entry (first at {first.within()})",
                )
            )
            continue
        seen[checked] = j
        devices.append(checked)
    return devices


def _legacy_slots(
    doc: Document, text: str, lines_share: bool
) -> tuple[list[DeclaredSlot], list[Diagnostic], list[Diagnostic]]:
    """The slots of `spec.map`, its errors, and (when its lines may share GPUs) one warning per
    GPU that several lines name, at the later lines' positions in the file."""
    path: Path = ("spec", "map")
    line, col = doc.values.get(path, (1, 1))
    line_offset, col_offset = line - 1, col - 1
    if path in doc.block_scalars:
        # Literal block content maps line for line onto the file, shifted by its indentation.
        first_line, indent = doc.block_scalars[path]
        line_offset, col_offset = first_line - 1, indent
    try:
        entries = parse_legacy(
            text,
            doc.source,
            line_offset=line_offset,
            column_offset=col_offset,
            path="spec.map",
            max_bytes=None,  # bounded by the file it is in
        )
    except PlacementError as exc:
        return [], list(exc.diagnostics), []
    slots = [_legacy_to_slot(doc.source, e, line_offset, col_offset) for e in entries]
    warnings: list[Diagnostic] = []
    if lines_share:
        for shared in shared_gpus(entries):
            entry = shared.entries[-1]
            column = entry.device_columns[entry.devices.index(shared.device)]
            warnings.append(
                Diagnostic(
                    Location(doc.source, entry.line + line_offset, column + col_offset, "spec.map"),
                    shared.describe(line_offset=line_offset),
                    severity="warning",
                    hint="say 'sharing: exclusive' to refuse this",
                )
            )
    return slots, [], warnings


def _legacy_to_slot(source: str, e: LegacyEntry, line_offset: int, col_offset: int) -> DeclaredSlot:
    loc = Location(source, e.line + line_offset, e.column + col_offset, "spec.map")
    return DeclaredSlot(e.index, e.node, e.devices, None, None, loc)


def cross_entry_checks(
    slots: Iterable[DeclaredSlot], sharing: Sharing, *, lines_share: bool = False
) -> list[Diagnostic]:
    """Duplicate indices, and (exclusive maps whose entries may not share) one GPU given to two
    entries."""
    errors: list[Diagnostic] = []
    by_index: dict[int, DeclaredSlot] = {}
    claims: dict[tuple[str, DeviceRef], DeclaredSlot] = {}
    whole_or_mig: dict[tuple[str, DeviceRef], DeclaredSlot] = {}
    for slot in slots:
        if slot.index in by_index:
            first = by_index[slot.index].location
            errors.append(
                Diagnostic(
                    slot.location,
                    f"duplicate index {slot.index} (first at {first.within()})",
                )
            )
            continue
        by_index[slot.index] = slot
        # A GPU in MIG mode serves its instances only: never a whole-GPU slot too, shared or not.
        errors.extend(_whole_and_mig(slot, whole_or_mig))
        if sharing is Sharing.SHARED or lines_share:
            continue
        # A spare is held once it serves: two entries may not count on the same one.
        for device, what in _named_and_spares(slot):
            owner = claims.get((slot.node, device))
            if owner is not None:
                errors.append(
                    Diagnostic(
                        slot.location,
                        f"{what} {device} on node {slot.node} is already given to index {owner.index} "
                        f"({_line_of(owner.location)}); an exclusive map gives each GPU to one slot",
                        hint="use another device, or set 'sharing: shared'",
                    )
                )
            else:
                claims[(slot.node, device)] = slot
    return errors


def _named_and_spares(slot: DeclaredSlot) -> list[tuple[DeviceRef, str]]:
    """The slot's devices, then its fallback devices, each with how a message names it."""
    return [(d, "device") for d in slot.devices] + [(d, "fallback device") for d in slot.fallback]


def _whole_and_mig(
    slot: DeclaredSlot, seen: dict[tuple[str, DeviceRef], DeclaredSlot]
) -> list[Diagnostic]:
    """A whole-GPU entry and a MIG entry of this map that name the same GPU (spelled the same)."""
    errors: list[Diagnostic] = []
    named = (slot.mig.gpu,) if slot.mig is not None else slot.devices
    for device in named:
        other = seen.setdefault((slot.node, device), slot)
        if (other.mig is None) != (slot.mig is None):
            mig, whole = (slot, other) if slot.mig is not None else (other, slot)
            errors.append(
                Diagnostic(
                    slot.location,
                    f"GPU {device} on node {slot.node} is given whole to index {whole.index} and "
                    f"as a MIG instance ({mig.mig}) to index {mig.index} "
                    f"({_line_of(other.location)}); a GPU in MIG mode serves its instances only",
                    hint="give the whole-GPU entry another GPU, or a MIG instance",
                )
            )
    return errors


def _line_of(location: Location) -> str:
    """`line 9` in a file; the field path in an object read from the apiserver."""
    return f"line {location.line}" if location.line else location.within()


def document_to_map(doc: Document) -> PlacementMap:
    """Validates one PlacementMap document; raises PlacementError with every problem found."""
    try:
        parsed = PlacementMapDocument.model_validate(doc.value)
    except ValidationError as exc:
        raise PlacementError(tuple(_pydantic_diagnostics(doc, exc))) from None
    errors = _header_problems(doc, parsed)
    spec = parsed.spec
    # The earlier tools' text keeps their meaning (lines naming one GPU share it) unless the map
    # asks for exclusive placement in so many words.
    lines_share = spec.map is not None and "sharing" not in spec.model_fields_set
    slots, slot_errors, warnings = _spec_slots(doc, spec, lines_share)
    errors.extend(slot_errors)
    errors.extend(cross_entry_checks(slots, spec.sharing, lines_share=lines_share))
    if errors:
        raise PlacementError(tuple(errors))
    return PlacementMap(
        key=MapKey(parsed.metadata.namespace, parsed.metadata.name),
        slots=tuple(sorted(slots, key=lambda s: s.index)),
        sharing=spec.sharing,
        indexing=spec.indexing,
        env_mode=spec.env_mode,
        rollout=Rollout(spec.rollout.strategy, spec.rollout.max_unavailable),
        source=doc.source,
        legacy_sharing=lines_share,
        warnings=tuple(warnings),
        same_clique=spec.same_clique,
        ranks=RankRules(spec.index_label or "", spec.pods_per_job or 0),
        gang=Gang(spec.gang.timeout_seconds) if spec.gang is not None else None,
    )


def _header_problems(doc: Document, parsed: PlacementMapDocument) -> list[Diagnostic]:
    """apiVersion, kind and the metadata names."""
    errors: list[Diagnostic] = []
    if parsed.api_version != EXPECTED_API_VERSION:
        errors.append(
            Diagnostic(
                doc.locate(("apiVersion",)),
                f"apiVersion must be {EXPECTED_API_VERSION!r}, got {parsed.api_version!r}",
            )
        )
    if parsed.kind != KIND:
        errors.append(
            Diagnostic(doc.locate(("kind",)), f"kind must be {KIND!r}, got {parsed.kind!r}")
        )
    for fname in ("name", "namespace"):
        value = getattr(parsed.metadata, fname)
        if not DNS_LABEL_RE.match(value):
            errors.append(
                Diagnostic(
                    doc.locate(("metadata", fname)),
                    f"metadata.{fname} {value!r} is not a valid DNS label (RFC 1123)",
                )
            )
    return errors


def _spec_slots(
    doc: Document, spec: MapSpec, lines_share: bool
) -> tuple[list[DeclaredSlot], list[Diagnostic], list[Diagnostic]]:
    """The slots of `spec.placements` or of the text `spec.map`, their errors and warnings."""
    if spec.placements is not None and spec.map is not None:
        error = Diagnostic(
            doc.locate(("spec", "map"), key=True), "'placements' and 'map' are mutually exclusive"
        )
        return [], [error], []
    if spec.placements is not None:
        slots, errors = _entry_slots(doc, spec.placements)
        return slots, errors, []
    if spec.map is not None:
        slots, errors, warnings = _legacy_slots(doc, spec.map, lines_share)
        if not slots and not errors:
            errors = [Diagnostic(doc.locate(("spec", "map")), "the map text has no entries")]
        return slots, errors, warnings
    return [], [Diagnostic(doc.locate(("spec",)), "spec needs 'placements' or 'map'")], []


def load_maps(text: str, source: str) -> LoadResult:
    """Every PlacementMap in a YAML stream; documents of other kinds are counted and skipped."""
    result = LoadResult()
    try:
        documents = list(load_documents(text, source))
    except PlacementError as exc:
        result.diagnostics.extend(exc.diagnostics)
        return result
    for doc in documents:
        if not is_placement_document(doc.value):
            result.other_documents += 1
            continue
        try:
            result.maps.append(document_to_map(doc))
        except PlacementError as exc:
            result.diagnostics.extend(exc.diagnostics)
    return result


def parse_map(text: str, source: str) -> PlacementMap:
    """Exactly one PlacementMap (the `placement.yaml` key of a source ConfigMap)."""
    result = load_maps(text, source)
    if result.diagnostics:
        raise PlacementError(tuple(result.diagnostics))
    if len(result.maps) != 1:
        raise PlacementError.single(
            Location(source, 1, 1),
            f"expected exactly one PlacementMap, found {len(result.maps)}",
            hint="put one map in each ConfigMap",
        )
    return result.maps[0]


#: The most a ConfigMap can hold (all its data together): a longer text cannot be a stored map, and
#: it is refused before it is parsed (a 1.8 MB text of 40,000 placements costs seconds to read).
MAX_MAP_BYTES = MAX_MAP_TEXT


def parse_map_for(text: str, source: str, expected: MapKey) -> PlacementMap:
    """A map read from the ConfigMap `expected`: its metadata must name that ConfigMap."""
    size = oversized(text, MAX_MAP_BYTES)
    if size is not None:
        raise PlacementError.single(
            Location(source, 1, 1),
            f"the map is {size} bytes, more than a ConfigMap can hold ({MAX_MAP_BYTES} bytes)",
            hint="split it into several maps",
        )
    pmap = parse_map(text, source)
    if pmap.key != expected:
        raise PlacementError.single(
            Location(source, 1, 1, "metadata"),
            f"map declares {pmap.key} but is stored in ConfigMap {expected}",
            hint="metadata.name and metadata.namespace must match the ConfigMap",
        )
    return pmap
