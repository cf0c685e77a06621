"""One binder decision for a pod of an `indexing: allocate` map of 20,000 slots (2,500 nodes x 8
GPUs), as the binder's thread makes it: `placement.binding.plan` against the binder's slot cache,
then the cache told of the slots it found unservable (`SlotCache.park`, as `Binder._decide` does).

Cases: the map nearly empty (its lowest slot free), nearly full (only its highest slot free), full
(NoFreeSlot), and nearly empty with the nodes of all but its highest slots cordoned, decided once
(cold: every free slot below is checked) and then again (what each later decision costs until a
node changes). Each figure is the median of `DECISIONS` decisions in this process, the median
again over the repeats.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

from bench import Measurement, below
from controller.slotcache import Holding, SlotCache
from placement.binding import Cluster, InventoryState, NodeState, Placement, PodFacts, Status, plan
from placement.compile import Compiler
from placement.inventory import GpuDevice, NodeInventory
from placement.maps import DeclaredSlot, PlacementMap
from placement.model import CompiledMap
from placement.types import GpuUuid, Indexing, MapKey, NodeName, Sharing, SlotKey

NAME = "decide"
SLOTS = 20_000
GPUS = 8
DECISIONS = 21
TARGET_MS = 1.0
KEY = MapKey("bench", "allocate")


def node_name(n: int) -> NodeName:
    return NodeName(f"gpu-node-{n}")


def inventory(n: int) -> NodeInventory:
    return NodeInventory(
        node_name(n),
        tuple(
            GpuDevice(i, GpuUuid(f"GPU-{n:08x}-{i:04x}"), "H100", 81_559, f"0000:{i:02x}:00.0")
            for i in range(GPUS)
        ),
    )


def build(slots: int) -> Cluster:
    nodes = slots // GPUS
    compiler = Compiler()
    inventories = {}
    for n in range(nodes):
        compiler.set_node(node_name(n), {})
        inv = inventory(n)
        compiler.set_inventory(inv)
        inventories[inv.node] = InventoryState(inv)
    placements = tuple(DeclaredSlot(s, node_name(s // GPUS), (s % GPUS,)) for s in range(slots))
    compiler.set_map(PlacementMap(KEY, placements, indexing=Indexing.ALLOCATE))
    model, _ = compiler.build()
    states = {node_name(n): NodeState(node_name(n)) for n in range(nodes)}
    return Cluster(model, states, {}, inventories)


def hold(cache: SlotCache, cmap: CompiledMap, indices: range) -> None:
    for i in indices:
        slot = cmap.slots[i]
        cache.add_bound(
            Holding(
                f"held-{i}",
                f"bench/held-{i}",
                SlotKey(KEY, i),
                slot.node,
                slot.gpus,
                Sharing.EXCLUSIVE,
                assumed=False,
            )
        )


def pending_pod() -> PodFacts:
    return PodFacts(KEY.namespace, "worker-x7k2p", "uid-pending", {}, "ReplicaSet", KEY.name)


def decide(cluster: Cluster, cache: SlotCache, cmap: CompiledMap) -> Placement | Status:
    """One decision as the binder's thread makes it (without the Binding)."""
    outcome = plan(pending_pod(), cluster, cache)
    if outcome.unservable:
        cache.park(cmap, outcome.unservable)
    return outcome


def timed(step: Callable[[], object], times: int) -> list[float]:
    out = []
    for _ in range(times):
        started = time.perf_counter()
        step()
        out.append((time.perf_counter() - started) * 1000)
    return out


def measure(slots: int) -> dict[str, float]:
    cluster = build(slots)
    cmap = cluster.model.maps[KEY]
    figures: dict[str, float] = {}

    def case(name: str, cache: SlotCache, expect: int | str) -> None:
        outcome = decide(cluster, cache, cmap)  # the first builds the cache's index of the map
        got = outcome.decision.index if isinstance(outcome, Placement) else outcome.reason
        if got != expect:
            raise RuntimeError(f"{name}: expected {expect}, got {got}")
        figures[name] = statistics.median(timed(lambda: decide(cluster, cache, cmap), DECISIONS))

    empty = SlotCache()
    hold(empty, cmap, range(1))
    case("nearly empty", empty, 1)
    full = SlotCache()
    hold(full, cmap, range(slots - 1))
    case("nearly full", full, slots - 1)
    hold(full, cmap, range(slots - 1, slots))
    case("full", full, "NoFreeSlot")

    nodes = slots // GPUS
    cordoned = Cluster(
        cluster.model,
        {node_name(n): NodeState(node_name(n), schedulable=n == nodes - 1) for n in range(nodes)},
        cluster.aliases,
        cluster.inventories,
    )
    cold = SlotCache()
    started = time.perf_counter()
    first = decide(cordoned, cold, cmap)
    figures["cordoned, first"] = (time.perf_counter() - started) * 1000
    if not isinstance(first, Placement) or first.decision.index != slots - GPUS:
        raise RuntimeError(f"cordoned: expected index {slots - GPUS}, got {first}")
    figures["cordoned, again"] = statistics.median(
        timed(lambda: decide(cordoned, cold, cmap), DECISIONS)
    )
    return figures


def run(repeats: int, small: bool = False) -> list[Measurement]:
    slots = SLOTS // 10 if small else SLOTS
    runs = [measure(slots) for _ in range(repeats)]
    label = f"{NAME} allocate map of {slots:,} slots"

    def samples(key: str) -> list[float]:
        return [r[key] for r in runs]

    return [
        below(label, "nearly empty: one decision", samples("nearly empty"), "ms", TARGET_MS),
        below(label, "nearly full: one decision", samples("nearly full"), "ms", TARGET_MS),
        below(label, "full (NoFreeSlot): one decision", samples("full"), "ms", TARGET_MS),
        below(
            label,
            "all but the last node cordoned: first decision",
            samples("cordoned, first"),
            "ms",
        ),
        below(
            label,
            "all but the last node cordoned: each later decision",
            samples("cordoned, again"),
            "ms",
            TARGET_MS,
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.decide")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--small", action="store_true")
    args = parser.parse_args(argv)
    for m in run(args.repeats, args.small):
        print(f"| {m.benchmark} | {m.metric} | {m.value:.3f} {m.unit} | {m.target} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
