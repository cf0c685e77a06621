"""Property tests: no input makes the parsers or the validator raise anything but PlacementError,
and every codec gives back what it was given."""

from __future__ import annotations

import string
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from placement.annotations import BindingDecision, decode_binding, encode_binding
from placement.devices import DeclaredDevices
from placement.errors import Diagnostic, Location, PlacementError
from placement.inventory import GpuDevice, NodeInventory
from placement.legacy import parse_legacy, render_legacy
from placement.maps import DeclaredSlot, PlacementMap, Requirement
from placement.model import CompiledMap, CompiledSlot, Model, decode_model, encode_model
from placement.reasons import Reason
from placement.serialize import dump_map
from placement.status import MapStatus, Phase, SlotCounts
from placement.types import (
    MAX_COUNT,
    MAX_DEVICE_INDEX,
    MAX_INDEX,
    DeviceRef,
    EnvMode,
    GpuUuid,
    Indexing,
    MapKey,
    NodeName,
    Sharing,
)
from placement.validate import _KNOWN_FIELDS, document_to_map, load_maps, parse_map
from placement.yamlsource import Document

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ROUND_TRIP = settings(max_examples=75, deadline=None, suppress_health_check=[HealthCheck.too_slow])

SAMPLE = """\
apiVersion: gpuplace.io/v1alpha1
kind: PlacementMap
metadata: {name: llm, namespace: inference}
spec:
  sharing: exclusive
  placements:
    - index: 0
      node: gpu-a-01
      devices: [0, GPU-5c1d0c3e-0b7a-4c2e-9f61-3a1b2c3d4e00]
    - {index: 1, node: gpu-a-02, count: 2, require: {product: H100, minMemoryMiB: 80000}}
---
apiVersion: gpuplace.io/v1alpha1
kind: PlacementMap
metadata: {name: legacy, namespace: default}
spec:
  map: |
    0=node1:0,1
    1=node2:2
"""

# -- strategies ---------------------------------------------------------------------------------
dns_labels = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,12}[a-z0-9])?", fullmatch=True)
node_names = st.one_of(
    st.from_regex(r"[a-z0-9]([-a-z0-9]{0,12}[a-z0-9])?(\.[a-z0-9]{1,5}){0,2}", fullmatch=True),
    st.from_regex(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,12}[A-Za-z0-9])?", fullmatch=True),
)
uuids = st.uuids().map(lambda u: GpuUuid(f"GPU-{u}"))
device_refs: st.SearchStrategy[DeviceRef] = st.one_of(st.integers(0, MAX_DEVICE_INDEX), uuids)
requirements = st.builds(
    Requirement,
    st.none() | st.text(max_size=30),
    st.none() | st.integers(1, 2**40),
)
json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=20)
)
structures = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.text(max_size=12) | st.sampled_from(list(string.ascii_letters)), inner, max_size=4
        )
    ),
    max_leaves=20,
)
# Keys the schema knows, so random structures reach deep into the validator.
known_keys = st.sampled_from(_KNOWN_FIELDS)
schema_like = st.recursive(
    json_scalars | st.integers(-5, 300) | st.sampled_from(["exclusive", "shared", "gpu-a-01"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(known_keys, inner, max_size=5),
    max_leaves=25,
)


@st.composite
def placement_maps(draw: st.DrawFn) -> PlacementMap:
    sharing = draw(st.sampled_from(list(Sharing)))
    indices = sorted(draw(st.sets(st.integers(0, MAX_INDEX), min_size=1, max_size=8)))
    claimed: set[tuple[str, DeviceRef]] = set()
    slots = []
    for index in indices:
        node = draw(node_names)
        require = draw(st.none() | requirements)
        wanted = draw(st.lists(device_refs, max_size=4, unique=True))
        if sharing is Sharing.EXCLUSIVE:
            wanted = [d for d in wanted if (node, d) not in claimed]
            claimed.update((node, d) for d in wanted)
        if wanted:
            slots.append(DeclaredSlot(index, node, tuple(wanted), None, require))
        else:
            slots.append(DeclaredSlot(index, node, (), draw(st.integers(1, MAX_COUNT)), require))
    return PlacementMap(
        key=MapKey(draw(dns_labels), draw(dns_labels)),
        slots=tuple(slots),
        sharing=sharing,
        indexing=draw(st.sampled_from(list(Indexing))),
        env_mode=draw(st.sampled_from(list(EnvMode))),
    )


#: What a slot declares: NVML indices and UUIDs, or a count.
declarations = st.one_of(
    st.builds(DeclaredDevices, st.tuples(st.integers(0, 255)) | st.tuples(uuids, uuids)),
    st.builds(DeclaredDevices, count=st.integers(1, 16)),
)


@st.composite
def compiled_maps(draw: st.DrawFn, key: MapKey) -> CompiledMap:
    slots = {}
    for index in draw(st.sets(st.integers(0, MAX_INDEX), max_size=6)):
        devices = tuple(draw(st.lists(uuids, max_size=3)))
        slots[index] = CompiledSlot(
            index=index,
            node=NodeName(draw(node_names)),
            devices=devices,
            device_indices=tuple(draw(st.lists(st.integers(0, 255), max_size=3))),
            declared=draw(declarations),
            blocked=draw(st.sampled_from(["", Reason.SLOT_CONFLICT, Reason.INSUFFICIENT_DEVICES])),
            message=draw(st.text(max_size=40)),
        )
    return CompiledMap(
        key,
        slots,
        draw(st.sampled_from(list(Sharing))),
        draw(st.sampled_from(list(Indexing))),
        draw(st.sampled_from(list(EnvMode))),
        draw(st.integers(0, 2**40)),
        draw(st.text(max_size=12)),
    )


@st.composite
def models(draw: st.DrawFn) -> Model:
    keys = draw(st.sets(st.builds(MapKey, dns_labels, dns_labels), max_size=5))
    return Model(draw(st.integers(0, 2**40)), {k: draw(compiled_maps(k)) for k in keys})


def mutated(text: str) -> st.SearchStrategy[str]:
    """`text` with a few characters replaced, inserted or deleted."""

    @st.composite
    def build(draw: st.DrawFn) -> str:
        out = text
        for _ in range(draw(st.integers(1, 4))):
            at = draw(st.integers(0, len(out)))
            what = draw(st.sampled_from(["insert", "delete", "replace"]))
            piece = draw(st.text(alphabet=" \n\t-:,[]{}#|>&*!%@`'\"=0123456789abcxyz", max_size=4))
            if what == "insert":
                out = out[:at] + piece + out[at:]
            elif what == "delete":
                out = out[:at] + out[at + len(piece) + 1 :]
            else:
                out = out[:at] + piece + out[at + len(piece) :]
        return out

    return build()


# -- nothing but PlacementError escapes -------------------------------------------------------
def only_placement_errors(text: str) -> None:
    result = load_maps(text, "fuzz.yaml")
    assert all(
        isinstance(d, Diagnostic) and d.location.source == "fuzz.yaml" for d in result.diagnostics
    )
    try:
        parse_map(text, "fuzz.yaml")
    except PlacementError as exc:
        assert exc.diagnostics
    try:
        parse_legacy(text, "fuzz")
    except PlacementError as exc:
        assert exc.diagnostics


@FUZZ
@given(st.text())
def test_arbitrary_text(text: str) -> None:
    only_placement_errors(text)


@FUZZ
@given(mutated(SAMPLE))
def test_damaged_maps(text: str) -> None:
    only_placement_errors(text)


@FUZZ
@given(structures)
def test_arbitrary_yaml_structures(value: Any) -> None:
    only_placement_errors(yaml.safe_dump(value))
    try:
        document_to_map(Document("fuzz", value))
    except PlacementError as exc:
        assert exc.diagnostics


@FUZZ
@given(
    metadata=structures | st.fixed_dictionaries({"name": dns_labels, "namespace": dns_labels}),
    spec=schema_like | st.fixed_dictionaries({"placements": st.lists(schema_like, max_size=4)}),
)
def test_structures_shaped_like_a_map(metadata: Any, spec: Any) -> None:
    value = {
        "apiVersion": "gpuplace.io/v1alpha1",
        "kind": "PlacementMap",
        "metadata": metadata,
        "spec": spec,
    }
    only_placement_errors(yaml.safe_dump(value))


@FUZZ
@given(st.lists(st.text(alphabet="0123456789=:,# \t-abcnode.GPU", max_size=30), max_size=6))
def test_legacy_like_lines(lines: list[str]) -> None:
    text = "\n".join(lines)
    try:
        entries = parse_legacy(text, "annotation")
    except PlacementError as exc:
        assert all(d.location.line >= 1 for d in exc.diagnostics)
    else:
        assert all(1 <= e.line <= max(1, len(lines)) for e in entries)


# -- round trips -----------------------------------------------------------------------------
@ROUND_TRIP
@given(placement_maps())
def test_valid_maps_round_trip_through_yaml(pmap: PlacementMap) -> None:
    assert parse_map(dump_map(pmap), "generated.yaml") == pmap


@pytest.mark.parametrize("product", ["\x85", "A\u2028B", "H100\u2029", "Ærø H100"])
def test_unicode_line_breaks_and_letters_survive_the_round_trip(product: str) -> None:
    # Found by the property above: PyYAML folds a raw U+0085 in a quoted scalar into a space.
    slot = DeclaredSlot(0, "gpu-1", count=1, require=Requirement(product))
    pmap = PlacementMap(MapKey("ml", "m"), (slot,))
    assert parse_map(dump_map(pmap), "generated.yaml").slots[0].require == Requirement(product)


@ROUND_TRIP
@given(
    st.lists(
        st.tuples(node_names, st.lists(device_refs, min_size=1, max_size=4, unique=True)),
        min_size=1,
        max_size=6,
    )
)
def test_legacy_text_round_trips(rows: list[tuple[str, list[DeviceRef]]]) -> None:
    entries = [(i, node, tuple(devices)) for i, (node, devices) in enumerate(rows)]
    parsed = parse_legacy(render_legacy(entries), "annotation")
    assert [(e.index, e.node, e.devices) for e in parsed] == entries


@pytest.mark.slow
@ROUND_TRIP
@given(models())
def test_model_round_trips_through_configmaps(model: Model) -> None:
    assert decode_model(encode_model(model)) == model


@ROUND_TRIP
@given(
    st.builds(
        BindingDecision,
        map=st.builds(MapKey, dns_labels, dns_labels),
        index=st.integers(0, MAX_INDEX),
        node=node_names.map(NodeName),
        devices=st.lists(uuids, max_size=4).map(tuple),
        cuda_visible_devices=st.text(max_size=40),
        model_generation=st.integers(0, 2**40),
    )
)
def test_binding_annotations_round_trip(decision: BindingDecision) -> None:
    assert decode_binding(decision.map.namespace, encode_binding(decision)) == decision


@st.composite
def inventories(draw: st.DrawFn) -> NodeInventory:
    indices = sorted(draw(st.sets(st.integers(0, 15), max_size=8)))
    devices = tuple(
        GpuDevice(
            index=i,
            uuid=draw(uuids),
            name=draw(st.text(max_size=24)),
            memory_mib=draw(st.integers(0, 2**20)),
            pci_bus_id=draw(st.text(max_size=16)),
            healthy=draw(st.booleans()),
            health_reason=draw(st.text(max_size=16)),
            numa_node=draw(st.none() | st.integers(0, 7)),
        )
        for i in indices
    )
    return NodeInventory(
        NodeName(draw(node_names)), devices, draw(st.text(max_size=10)), draw(st.text(max_size=10))
    )


@ROUND_TRIP
@given(inventories())
def test_inventory_round_trips_through_json(inventory: NodeInventory) -> None:
    assert NodeInventory.from_json(inventory.to_json()) == inventory


diagnostics = st.builds(
    Diagnostic,
    st.builds(
        Location,
        st.text(max_size=20),
        st.integers(0, 10**6),
        st.integers(0, 10**4),
        st.text(max_size=20),
    ),
    st.text(max_size=60),
    st.sampled_from(["error", "warning"]),
    st.text(max_size=30),
)


@ROUND_TRIP
@given(
    st.builds(
        MapStatus,
        phase=st.sampled_from(list(Phase)),
        observed_generation=st.integers(0, 2**40),
        observed_version=st.text(max_size=12),
        message=st.text(max_size=60),
        errors=st.lists(diagnostics, max_size=3).map(tuple),
        slots=st.builds(
            SlotCounts,
            st.integers(0, 10**5),
            st.integers(0, 10**5),
            st.integers(0, 10**5),
            st.integers(0, 10**5),
        ),
        serving_version=st.text(max_size=12),
    )
)
def test_status_round_trips_through_json(status: MapStatus) -> None:
    assert MapStatus.from_json(status.to_json()) == status
