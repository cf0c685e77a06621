"""Spare (fallback) devices: validation, resolution at compile time, conflicts, drift, grants."""

from __future__ import annotations

import textwrap

from placement.compile import Compiler
from placement.conflicts import find_conflicts
from placement.drift import BoundSlot, DriftKind, drift_of
from placement.errors import Location
from placement.grants import check_map, parse_policy, resolve
from placement.inventory import GpuDevice, NodeInventory
from placement.maps import DeclaredSlot, PlacementMap, Requirement
from placement.model import CompiledSlot, Model
from placement.reasons import Reason
from placement.spares import serves_from_fallback
from placement.status import Phase
from placement.types import DeviceRef, EnvMode, GpuUuid, MapKey, NodeName, Sharing, SlotKey
from placement.validate import load_maps, parse_map

NODE = NodeName("gpu-1")
KEY = MapKey("ml", "llm")


def uuid(i: int) -> GpuUuid:
    return GpuUuid(f"GPU-00000001-0000-4000-8000-{i:012x}")


def inventory(
    present: tuple[int, ...] = tuple(range(8)), unhealthy: tuple[int, ...] = ()
) -> NodeInventory:
    return NodeInventory(
        NODE,
        tuple(
            GpuDevice(
                i,
                uuid(i),
                "NVIDIA H100 80GB HBM3",
                81559,
                healthy=i not in unhealthy,
                health_reason="XID 79" if i in unhealthy else "",
            )
            for i in present
        ),
    )


def spared(
    devices: tuple[DeviceRef, ...], fallback: tuple[DeviceRef, ...], index: int = 0
) -> DeclaredSlot:
    return DeclaredSlot(index, NODE, devices, fallback=fallback)


def build(
    inv: NodeInventory, *maps: PlacementMap, compiler: Compiler | None = None
) -> tuple[Compiler, Model]:
    c = compiler or Compiler()
    c.set_node(NODE, {})
    c.set_inventory(inv)
    for m in maps:
        c.set_map(m)
    model, _ = c.build()
    return c, model


def served(model: Model, key: MapKey = KEY, index: int = 0) -> CompiledSlot:
    found = model.slot(key, index)
    assert found is not None
    return found


# -- validation ---------------------------------------------------------------------------------
HEADER = (
    "apiVersion: gpuplace.io/v1alpha1\nkind: PlacementMap\nmetadata: {name: m, namespace: ml}\n"
)


def problems(spec: str) -> list[tuple[int, int, str]]:
    result = load_maps(HEADER + "spec:\n" + textwrap.indent(textwrap.dedent(spec), "  "), "m.yaml")
    assert not result.maps
    return [(d.location.line, d.location.column, d.message) for d in result.diagnostics]


def test_fallback_is_read_in_order() -> None:
    text = (
        HEADER
        + "spec:\n  placements:\n    - {index: 0, node: n1, devices: [0], fallback: [7, 6]}\n"
    )
    assert parse_map(text, "m.yaml").slots[0].fallback == (7, 6)


def test_fallback_needs_devices() -> None:
    assert problems("""\
        placements:
          - {index: 0, node: n1, count: 2, fallback: [7]}
    """) == [(6, 38, "'fallback' needs 'devices'")]


def test_fallback_repeats_and_overlaps_are_located() -> None:
    assert problems("""\
        placements:
          - index: 0
            node: n1
            devices: [0, 1]
            fallback: [7, 1, 7, nonsense]
    """) == [
        (9, 21, "fallback device 1 is one of the entry's own devices"),
        (9, 24, "fallback device 7 listed twice (first at line 9, column 18)"),
        (9, 27, "device 'nonsense' is neither an NVML index, a GPU UUID nor a PCI bus ID"),
    ]


def test_two_entries_of_an_exclusive_map_may_not_share_a_spare() -> None:
    found = problems("""\
        placements:
          - {index: 0, node: n1, devices: [0], fallback: [7]}
          - {index: 1, node: n1, devices: [1], fallback: [7]}
    """)
    assert found == [
        (
            7,
            7,
            "fallback device 7 on node n1 is already given to index 0 (line 6); an exclusive map "
            "gives each GPU to one slot",
        )
    ]


def test_maps_may_not_share_a_spare_unless_both_are_shared() -> None:
    def declared(name: str, slot: DeclaredSlot, sharing: Sharing) -> PlacementMap:
        located = DeclaredSlot(
            slot.index, slot.node, slot.devices, fallback=slot.fallback,
            location=Location(f"{name}.yaml", 7, 7),
        )  # fmt: skip
        return PlacementMap(MapKey("ml", name), (located,), sharing)

    a = declared("a", spared((0,), (7,)), Sharing.EXCLUSIVE)
    b = declared("b", spared((1,), (7,)), Sharing.EXCLUSIVE)
    (conflict,) = find_conflicts([a, b])
    assert conflict.diagnostic().message.startswith(
        "device 7 (a fallback device) on node gpu-1 of exclusive map ml/b index 0 (b.yaml:7:7) "
        "is also claimed by exclusive map ml/a index 0"
    )
    # A spare that another map names as its own device conflicts too.
    c = declared("c", DeclaredSlot(0, NODE, (7,)), Sharing.EXCLUSIVE)
    assert len(find_conflicts([a, c])) == 1
    shared_a = declared("a", spared((0,), (7,)), Sharing.SHARED)
    shared_b = declared("b", spared((1,), (7,)), Sharing.SHARED)
    assert find_conflicts([shared_a, shared_b]) == []


def test_a_spare_needs_the_grant_too() -> None:
    policy = parse_policy(
        "apiVersion: gpuplace.io/v1alpha1\nkind: PlacementPolicy\nmetadata: {name: cluster}\n"
        "spec:\n  grants:\n    - {namespaces: [ml], nodes: [gpu-1], devices: [0, 1]}\n",
        "policy.yaml",
    )
    view = resolve(policy, False, {"gpu-1": {}})
    ok = PlacementMap(KEY, (spared((0,), (1,)),))
    outside = PlacementMap(KEY, (spared((0,), (7,)),))
    assert check_map(view, ok) == []
    (refused,) = check_map(view, outside)
    assert "may not use GPU(s) 7 of node gpu-1" in refused.message


# -- compile ------------------------------------------------------------------------------------
def test_declared_devices_serve_while_present_and_healthy() -> None:
    _, model = build(inventory(), PlacementMap(KEY, (spared((0, 1), (7,)),)))
    slot = served(model)
    assert slot.devices == (uuid(0), uuid(1)) and slot.message == ""
    assert not serves_from_fallback(slot)


def test_a_missing_or_unhealthy_device_is_served_by_the_first_usable_spare_in_order() -> None:
    # Spare 6 is unhealthy, 5 is missing: 7 stands in for 1, then 4 for 2.
    inv = inventory(present=(0, 2, 3, 4, 6, 7), unhealthy=(2, 6))
    c, model = build(inv, PlacementMap(KEY, (spared((0, 1, 2), (6, 5, 7, 4)),)))
    slot = served(model)
    assert not slot.blocked
    assert slot.devices == (uuid(0), uuid(7), uuid(4))
    assert slot.device_indices == (0, 7, 4)
    assert slot.cuda_visible_devices(EnvMode.INDEX) == "0,7,4"
    assert slot.cuda_visible_devices(EnvMode.UUID) == f"{uuid(0)},{uuid(7)},{uuid(4)}"
    assert serves_from_fallback(slot)
    assert slot.message == (
        f"serving from fallback: device 1 not found: fallback device 7 ({uuid(7)}) stands in; "
        f"device 2 unhealthy (XID 79): fallback device 4 ({uuid(4)}) stands in"
    )
    report = c.reports[KEY]
    assert report.phase is Phase.DEGRADED and report.served == 1
    assert "serving from fallback" in report.message


def test_without_a_usable_spare_the_slot_is_blocked_as_before() -> None:
    _, model = build(inventory(present=(0, 2)), PlacementMap(KEY, (spared((0, 1), (7,)),)))
    assert served(model).blocked is Reason.DEVICE_MISSING


def test_a_spare_held_by_another_exclusive_slot_is_not_used() -> None:
    other = PlacementMap(MapKey("ml", "other"), (DeclaredSlot(0, NODE, (7,)),))
    mine = PlacementMap(KEY, (spared((1,), (7, 6)),))
    _, model = build(inventory(present=(0, 2, 3, 4, 5, 6, 7)), mine, other)
    assert served(model).devices == (uuid(6),)
    assert served(model, MapKey("ml", "other")).devices == (uuid(7),)


def test_back_to_the_declared_device_and_the_pod_on_the_spare_drifts() -> None:
    c, model = build(inventory(unhealthy=(1,)), PlacementMap(KEY, (spared((1,), (7,)),)))
    assert served(model).devices == (uuid(7),)
    on_spare = BoundSlot(SlotKey(KEY, 0), NODE, (uuid(7),))
    assert drift_of(on_spare, model) is None
    _, model = build(inventory(), compiler=c)
    assert served(model).devices == (uuid(1),) and not serves_from_fallback(served(model))
    drift = drift_of(on_spare, model)
    assert drift is not None and drift.kind is DriftKind.SLOT_MOVED
    assert drift.now_gpus == (uuid(1),)


def test_a_spare_must_match_the_requirement() -> None:
    inv = NodeInventory(
        NODE,
        (
            GpuDevice(0, uuid(0), "NVIDIA H100 80GB HBM3", 81559, healthy=False),
            GpuDevice(1, uuid(1), "NVIDIA A100-SXM4-40GB", 40960),
            GpuDevice(2, uuid(2), "NVIDIA H100 80GB HBM3", 81559),
        ),
    )
    require = Requirement(product="NVIDIA H100 80GB HBM3")
    slot = DeclaredSlot(0, NODE, (0,), require=require, fallback=(1, 2))
    _, model = build(inv, PlacementMap(KEY, (slot,)))
    assert served(model).devices == (uuid(2),)
