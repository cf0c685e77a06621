"""The per-GPU series (controller/gpumetrics.py): DCGM exporter's label names, built from the
inventories and the slot cache at scrape time; every family passes `promtool check metrics`
(Debian's prometheus package, installed by `make unit`/`make test`; a missing promtool fails),
but for DCGM's camelCase `modelName`."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import replace

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from controller.gpumetrics import GpuCollector, MapSlotsCollector
from controller.metrics import ControllerMetrics
from controller.slotcache import Holding
from placement.devices import GpuId
from placement.inventory import GpuDevice, NodeInventory
from placement.model import CompiledMap, CompiledSlot, Model
from placement.status import MapStatus, Phase, SlotCounts
from placement.types import GpuUuid, MapKey, NodeName, Sharing, SlotKey

A = NodeName("node-a")
INVENTORY = NodeInventory(
    A,
    (
        GpuDevice(0, GpuUuid("GPU-a0"), "NVIDIA H100 80GB HBM3"),
        GpuDevice(1, GpuUuid("GPU-a1"), "NVIDIA H100 80GB HBM3", healthy=False),
    ),
)


def holding(uid: str, pod: str, index: int, *gpus: str, assumed: bool = False) -> Holding:
    slot = SlotKey(MapKey("ml", "llm"), index)
    return Holding(uid, pod, slot, A, gpus, Sharing.EXCLUSIVE, assumed)


def scrape(holdings: list[Holding]) -> str:
    registry = CollectorRegistry()
    registry.register(GpuCollector(lambda: {A: INVENTORY}, lambda: holdings))
    return generate_latest(registry).decode()


def samples(text: str, name: str) -> list[dict[str, str]]:
    return [
        dict(s.labels)
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    ]


def test_info_per_gpu_and_a_holder_per_held_gpu_with_dcgm_labels() -> None:
    text = scrape(
        [
            holding("u0", "ml/web-0", 0, GpuId.of_uuid("GPU-a0")),
            holding("u1", "ml/web-1", 1, GpuId.of_index(1)),  # held by index: UUID from inventory
            holding("u2", "ml/web-2", 2, GpuId.of_uuid("GPU-a0"), assumed=True),  # not bound yet
        ]
    )
    assert samples(text, "gpuplace_gpu_info") == [
        {
            "Hostname": "node-a",
            "gpu": "0",
            "UUID": "GPU-a0",
            "modelName": "NVIDIA H100 80GB HBM3",
            "healthy": "true",
        },
        {
            "Hostname": "node-a",
            "gpu": "1",
            "UUID": "GPU-a1",
            "modelName": "NVIDIA H100 80GB HBM3",
            "healthy": "false",
        },
    ]
    holders = samples(text, "gpuplace_gpu_holder")
    assert [(h["pod"], h["gpu"], h["UUID"], h["map"], h["index"]) for h in holders] == [
        ("web-0", "0", "GPU-a0", "llm", "0"),
        ("web-1", "1", "GPU-a1", "llm", "1"),
    ]
    assert {h["namespace"] for h in holders} == {"ml"}


def test_declared_gpus_from_the_model_held_or_not() -> None:
    slot = CompiledSlot(3, A, (GpuUuid("GPU-a1"),), (1,))
    unresolved = CompiledSlot(4, A, (), (0,))  # index only: the UUID from the inventory
    model = Model(
        2, {MapKey("ml", "llm"): CompiledMap(MapKey("ml", "llm"), {3: slot, 4: unresolved})}
    )
    registry = CollectorRegistry()
    registry.register(GpuCollector(lambda: {A: INVENTORY}, list, lambda: model))
    declared = samples(generate_latest(registry).decode(), "gpuplace_gpu_declared")
    assert sorted((d["index"], d["gpu"], d["UUID"]) for d in declared) == [
        ("3", "1", "GPU-a1"),
        ("4", "0", "GPU-a0"),
    ]
    assert {d["map"] for d in declared} == {"llm"} and {d["namespace"] for d in declared} == {"ml"}


def test_a_shared_gpu_is_one_series_whose_differing_labels_are_empty() -> None:
    both = CompiledSlot(0, A, (GpuUuid("GPU-a0"),), (0,))
    model = Model(
        2,
        {
            MapKey("ml", "llm"): CompiledMap(
                MapKey("ml", "llm"),
                {i: replace(both, index=i) for i in range(3)},
                sharing=Sharing.SHARED,
            )
        },
    )
    held = [holding(f"u{i}", f"ml/web-{i}", i, "GPU-a0") for i in range(3)]
    registry = CollectorRegistry()
    registry.register(GpuCollector(lambda: {A: INVENTORY}, lambda: held, lambda: model))
    text = generate_latest(registry).decode()
    assert samples(text, "gpuplace_gpu_holder") == [
        {
            "Hostname": "node-a",
            "gpu": "0",
            "UUID": "GPU-a0",
            "namespace": "ml",
            "pod": "",
            "map": "llm",
            "index": "",
        }
    ]
    assert values(text, "gpuplace_gpu_holder") == [1.0]  # DCGM's join multiplies by it
    assert samples(text, "gpuplace_gpu_declared") == [
        {
            "Hostname": "node-a",
            "gpu": "0",
            "UUID": "GPU-a0",
            "namespace": "ml",
            "map": "llm",
            "index": "",
        }
    ]
    assert values(text, "gpuplace_gpu_declared") == [3.0]


def test_gpus_no_agent_reports_are_counted_not_labelled() -> None:
    ghost = NodeName("node-ghost")
    model = Model(
        2,
        {
            MapKey("ml", "llm"): CompiledMap(
                MapKey("ml", "llm"),
                {
                    0: CompiledSlot(0, A, (GpuUuid("GPU-nowhere"),), ()),
                    1: CompiledSlot(1, ghost, (), (0, 1)),
                    2: CompiledSlot(2, A, (GpuUuid("GPU-a0"),), (0,)),
                },
            )
        },
    )
    held = [
        holding("u0", "ml/web-0", 0, "GPU-nowhere"),
        Holding(
            "u1",
            "ml/web-1",
            SlotKey(MapKey("ml", "llm"), 1),
            ghost,
            ("#0",),
            Sharing.EXCLUSIVE,
            False,
        ),
    ]
    registry = CollectorRegistry()
    registry.register(GpuCollector(lambda: {A: INVENTORY}, lambda: held, lambda: model))
    text = generate_latest(registry).decode()
    assert samples(text, "gpuplace_gpu_holder") == []
    assert [d["UUID"] for d in samples(text, "gpuplace_gpu_declared")] == ["GPU-a0"]
    unreported = {
        s.labels["by"]: s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "gpuplace_gpus_unreported"
    }
    assert unreported == {"held": 2, "declared": 3}


def test_series_are_bounded_by_the_gpus_and_the_maps_whatever_the_maps_say() -> None:
    """Thousands of slots over one 8-GPU node, and many maps: 3 series per reported GPU, 7 per
    map and 2 more, on top of the controller's own families (fixed in number), as
    docs/observability.md says."""
    gpus = 8
    node = NodeInventory(
        A, tuple(GpuDevice(i, GpuUuid(f"GPU-a{i}"), "NVIDIA H100 80GB HBM3") for i in range(gpus))
    )
    maps: dict[MapKey, CompiledMap] = {}
    holdings: list[Holding] = []
    for m in range(40):
        key = MapKey(f"team-{m}", f"map-{m}")
        slots = {
            i: CompiledSlot(i, A, (GpuUuid(f"GPU-a{i % gpus}"),), (i % gpus,)) for i in range(512)
        }
        # and names that exist nowhere: counted, never labelled
        slots[512] = CompiledSlot(512, NodeName(f"ghost-{m}"), (), tuple(range(64)))
        maps[key] = CompiledMap(key, slots, sharing=Sharing.SHARED)
        holdings.extend(
            Holding(
                f"{m}-{i}",
                f"{key.namespace}/pod-{i}",
                SlotKey(key, i),
                A,
                (f"GPU-a{i % gpus}",),
                Sharing.SHARED,
                False,
            )
            for i in range(512)
        )
    statuses = {key: MapStatus(Phase.VALID, slots=SlotCounts(513)) for key in maps}
    own = series_count(ControllerMetrics().registry)
    registry = ControllerMetrics().registry
    registry.register(GpuCollector(lambda: {A: node}, lambda: holdings, lambda: Model(2, maps)))
    registry.register(MapSlotsCollector(lambda: statuses))
    assert series_count(registry) <= own + 3 * gpus + 7 * len(maps) + 2
    declared = values(generate_latest(registry).decode(), "gpuplace_gpu_declared")
    assert sorted(declared) == [40 * 512 / gpus] * gpus


def series_count(registry: CollectorRegistry) -> int:
    return sum(len(f.samples) for f in registry.collect())


def values(text: str, name: str) -> list[float]:
    return [
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    ]


def test_slots_per_map_from_the_statuses() -> None:
    registry = CollectorRegistry()
    status = MapStatus(Phase.DEGRADED, slots=SlotCounts(total=4, served=3, bound=2, blocked=1))
    registry.register(MapSlotsCollector(lambda: {MapKey("ml", "llm"): status}))
    rows = {
        s["state"]: s for s in samples(generate_latest(registry).decode(), "gpuplace_map_slots")
    }
    assert set(rows) == {
        "total",
        "served",
        "bound",
        "blocked",
        "drifted",
        "renumbered",
        "unverifiable",
    }
    assert rows["blocked"] == {"namespace": "ml", "map": "llm", "state": "blocked"}
    values = {
        s.labels["state"]: s.value
        for f in text_string_to_metric_families(generate_latest(registry).decode())
        for s in f.samples
    }
    assert (values["total"], values["bound"], values["blocked"]) == (4, 2, 1)


def test_promtool_accepts_every_family() -> None:
    promtool = shutil.which("promtool")
    assert promtool is not None, "promtool not found: make unit installs Debian's prometheus"
    registry = ControllerMetrics().registry
    registry.register(
        GpuCollector(lambda: {A: INVENTORY}, lambda: [holding("u0", "ml/web-0", 0, "GPU-a0")])
    )
    registry.register(
        MapSlotsCollector(
            lambda: {MapKey("ml", "llm"): MapStatus(Phase.VALID, slots=SlotCounts(1))}
        )
    )
    text = generate_latest(registry)
    assert b"gpuplace_map_slots{" in text
    assert b"gpuplace_build_info{" in text
    # promtool's linter wants snake_case label names; `modelName` is DCGM exporter's own (the
    # point of these labels is to match its series), so that remark, and only it, is expected.
    linted = check_metrics(promtool, text)
    assert set(linted.stderr.decode().splitlines()) == {
        "gpuplace_gpu_info label names should be written in 'snake_case' not 'camelCase'"
    }
    renamed = text.replace(b"modelName=", b"model_name=")
    clean = check_metrics(promtool, renamed)
    assert clean.returncode == 0, clean.stderr.decode() + clean.stdout.decode()


def check_metrics(promtool: str, text: bytes) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, timeout=60, check=False
    )
