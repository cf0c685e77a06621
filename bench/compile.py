"""Compiling a large cluster: 10,000 nodes x 8 GPUs, 10,000 maps of 8 slots (80,000 slots).

Maps mix every way of naming devices: by index, by UUID, by `count` (with `require`), and by a
logical node name resolved through the `gpu-node-name` label. Each map spreads its 8 slots over 8
nodes, so the `count` entries must pick around the explicit claims of other maps.

Each repeat runs in a fresh interpreter (`python -m bench.compile --worker`) so that peak RSS is
that of one compile, measured with resource.getrusage.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from dataclasses import replace

from bench import Measurement, below, run_worker
from placement.annotations import LEGACY_NODE_LABEL
from placement.compile import Compiler
from placement.inventory import GpuDevice, NodeInventory
from placement.maps import DeclaredSlot, PlacementMap, Requirement
from placement.model import decode_model, encode_model
from placement.types import GpuUuid, MapKey, NodeName

NAME = "compile"
NODES = 10_000
GPUS = 8
PRODUCT = "NVIDIA H100 80GB HBM3"
UPDATES = 21
TARGET_FULL_S = 2.0
TARGET_UPDATE_MS = 100.0
TARGET_RSS_MIB = 500.0


def gpu_uuid(node: int, index: int) -> GpuUuid:
    return GpuUuid(f"GPU-{node:08x}-0000-4000-8000-{index:012x}")


def node_name(node: int) -> NodeName:
    return NodeName(f"gpu-node-{node}")


def inventory(node: int) -> NodeInventory:
    return NodeInventory(
        node_name(node),
        tuple(
            GpuDevice(
                index=i,
                uuid=gpu_uuid(node, i),
                name=PRODUCT,
                memory_mib=81_559,
                pci_bus_id=f"00000000:{0x18 + i * 0x10:02X}:00.0",
                numa_node=i // 4,
            )
            for i in range(GPUS)
        ),
    )


def cluster_map(m: int, nodes: int = NODES) -> PlacementMap:
    """Map `m`: slot j on node (m + j * nodes/8) % nodes, GPU j; no two maps claim the same GPU."""
    stride = nodes // GPUS
    slots = []
    for j in range(GPUS):
        node = (m + j * stride) % nodes
        style = m % 4
        if style == 0:
            slot = DeclaredSlot(j, node_name(node), (j,))
        elif style == 1:
            slot = DeclaredSlot(j, node_name(node), (gpu_uuid(node, j),))
        elif style == 2:
            slot = DeclaredSlot(j, node_name(node), count=1, require=Requirement(PRODUCT, 80_000))
        else:
            slot = DeclaredSlot(j, f"logical-{node}", (j,))
        slots.append(slot)
    return PlacementMap(MapKey(f"team-{m % 50}", f"map-{m}"), tuple(slots))


def moved(pmap: PlacementMap) -> PlacementMap:
    """The same claims, each given to another index: every slot of the map moves."""
    slots = pmap.slots
    return replace(
        pmap,
        slots=tuple(replace(s, index=slots[-1 - i].index) for i, s in enumerate(slots)),
    )


def worker(nodes: int) -> dict[str, float]:
    inventories = [inventory(n) for n in range(nodes)]
    maps = [cluster_map(m, nodes) for m in range(nodes)]

    start, cpu = time.perf_counter(), time.process_time()
    compiler = Compiler()
    for n, inv in enumerate(inventories):
        compiler.set_node(inv.node, {LEGACY_NODE_LABEL: f"logical-{n}"})
        compiler.set_inventory(inv)
    for pmap in maps:
        compiler.set_map(pmap)
    model, reports = compiler.build()
    full_s = time.perf_counter() - start
    full_cpu_s = time.process_time() - cpu

    served = sum(r.served for r in reports.values())
    slots = sum(len(m.slots) for m in model.maps.values())
    if served != slots or slots != nodes * GPUS:
        raise RuntimeError(f"expected {nodes * GPUS} served slots, got {served} of {slots}")

    updates: list[float] = []
    for u in range(UPDATES):
        pmap = maps[(u * 37) % nodes]
        changed = moved(pmap)
        start = time.perf_counter()
        compiler.set_map(changed)
        model, _ = compiler.build()
        updates.append(time.perf_counter() - start)
        maps[(u * 37) % nodes] = changed

    start = time.perf_counter()
    encoded = encode_model(model)
    encode_s = time.perf_counter() - start
    start = time.perf_counter()
    decoded = decode_model(encoded)
    decode_s = time.perf_counter() - start
    if decoded != model:
        raise RuntimeError("decode_model(encode_model(model)) differs from the model")

    sizes = [len(v) for data in encoded.values() for v in data.values()]
    return {
        "full_s": full_s,
        "full_cpu_s": full_cpu_s,
        "update_ms": statistics.median(updates) * 1000,
        "encode_s": encode_s,
        "decode_s": decode_s,
        "shards": len(encoded) - 1,
        "model_mib": sum(sizes) / 2**20,
        "largest_shard_kib": max(sizes) / 1024,
        # Linux reports ru_maxrss in KiB.
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def run(repeats: int, small: bool = False) -> list[Measurement]:
    nodes = NODES // 10 if small else NODES
    runs = [run_worker("bench.compile", "--worker", f"--nodes={nodes}") for _ in range(repeats)]

    def samples(key: str) -> list[float]:
        return [float(r[key]) for r in runs]

    label = f"{NAME} {nodes:,}x{GPUS}"
    return [
        below(label, "full compile", samples("full_s"), "s", TARGET_FULL_S),
        # CPU time is what the compile costs whatever else the machine runs at the time.
        below(label, "full compile (CPU)", samples("full_cpu_s"), "s", TARGET_FULL_S),
        below(label, "one-map update", samples("update_ms"), "ms", TARGET_UPDATE_MS),
        below(label, "encode model", samples("encode_s"), "s"),
        below(label, "decode model", samples("decode_s"), "s"),
        below(label, "peak RSS", samples("peak_rss_mib"), "MiB", TARGET_RSS_MIB),
        below(label, "model size", samples("model_mib"), "MiB"),
        below(label, "model shards", samples("shards"), "shards"),
        below(label, "largest shard", samples("largest_shard_kib"), "KiB", 900),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.compile")
    parser.add_argument("--worker", action="store_true", help="run one repeat and print JSON")
    parser.add_argument("--nodes", type=int, default=NODES)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.nodes)))
        return 0
    for m in run(3):
        print(f"{m.metric}: {m.value:.3f} {m.unit} {m.target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
