"""The controller's per-GPU series at the design's scale: 5,000 nodes x 8 GPUs (40,000 GPUs), every
GPU declared by one slot and held by one pod. One scrape builds `gpuplace_gpu_info`,
`gpuplace_gpu_holder` and `gpuplace_gpu_declared` from the inventories, the slot cache and the
model (controller/gpumetrics.py) and renders the whole registry as Prometheus' text format, as a
scrape of /metrics does. Reported: series, bytes and the time of one
scrape (median of 5 per repeat), and its CPU time."""

from __future__ import annotations

import statistics
import time

from prometheus_client import generate_latest

from bench import Measurement, below
from controller.gpumetrics import GpuCollector
from controller.metrics import ControllerMetrics
from controller.slotcache import Holding
from placement.devices import GpuId
from placement.inventory import GpuDevice, NodeInventory
from placement.model import CompiledMap, CompiledSlot, Model
from placement.types import GpuUuid, MapKey, NodeName, Sharing, SlotKey

NAME = "scrape"
NODES = 5_000
GPUS = 8
SCRAPES = 5
TARGET_SCRAPE_S = 2.0
PER_GPU = (
    b"gpuplace_gpu_info{",
    b"gpuplace_gpu_holder{",
    b"gpuplace_gpu_declared{",
)  # well inside Prometheus' default 10 s scrape timeout


def cluster(nodes: int) -> tuple[dict[NodeName, NodeInventory], list[Holding], Model]:
    inventories: dict[NodeName, NodeInventory] = {}
    holdings: list[Holding] = []
    slots: dict[MapKey, dict[int, CompiledSlot]] = {}
    for n in range(nodes):
        node = NodeName(f"gpu-node-{n}")
        devices = tuple(
            GpuDevice(i, GpuUuid(f"GPU-{n:08x}-0000-4000-8000-{i:012x}"), "NVIDIA H100 80GB HBM3")
            for i in range(GPUS)
        )
        inventories[node] = NodeInventory(node, devices)
        for device in devices:
            pod = n * GPUS + device.index
            slot = SlotKey(MapKey(f"team-{pod % 50}", f"map-{pod // 100}"), pod % 100)
            slots.setdefault(slot.map, {})[slot.index] = CompiledSlot(
                slot.index, node, (device.uuid,), (device.index,)
            )
            holdings.append(
                Holding(
                    f"uid-{pod}",
                    f"{slot.map.namespace}/{slot.map.name}-{slot.index}",
                    slot,
                    node,
                    (GpuId.of_uuid(device.uuid),),
                    Sharing.EXCLUSIVE,
                    assumed=False,
                )
            )
    model = Model(1, {key: CompiledMap(key, by_index) for key, by_index in slots.items()})
    return inventories, holdings, model


def run(repeats: int, small: bool = False) -> list[Measurement]:
    nodes = NODES // 10 if small else NODES
    inventories, holdings, model = cluster(nodes)
    metrics = ControllerMetrics()
    metrics.registry.register(GpuCollector(lambda: inventories, lambda: holdings, lambda: model))
    wall: list[float] = []
    cpu: list[float] = []
    size = series = 0
    for _ in range(repeats):
        walls, cpus = [], []
        for _ in range(SCRAPES):
            started, started_cpu = time.perf_counter(), time.process_time()
            text = generate_latest(metrics.registry)
            walls.append(time.perf_counter() - started)
            cpus.append(time.process_time() - started_cpu)
        wall.append(statistics.median(walls))
        cpu.append(statistics.median(cpus))
        size = len(text)
        series = sum(1 for line in text.splitlines() if line.startswith(PER_GPU))
    label = f"scrape {nodes:,} nodes x {GPUS} GPUs, each declared and held"
    return [
        below(label, "per-GPU series (info, holder, declared)", [float(series)], "series"),
        below(label, "/metrics size", [size / 2**20], "MiB"),
        below(label, "one scrape (build + render)", wall, "s", TARGET_SCRAPE_S),
        below(label, "one scrape: CPU", cpu, "s"),
    ]
