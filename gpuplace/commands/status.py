"""`gpuplace status`: maps, slots, bound pods and degraded devices of a cluster, as tables (or
`-o json|yaml`); `--gpus` shows the node x GPU grid of `gpuplace gpus` instead.

Maps are listed in both forms: FORM `resource` for a PlacementMap custom resource, `configmap` for
a labelled ConfigMap; a ConfigMap that a custom resource of the same content supersedes shows
PHASE Superseded (it can be deleted).

Several clusters: `--context a --context b` (or `--all-contexts`) reads each cluster at once and
prints each table once, with a CLUSTER column (`-o json|yaml`: one entry per cluster); a cluster
that does not answer is a row that says UNREACHABLE and why, and the others are shown as usual."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from gpuplace import fleet, inspect, mapviews
from gpuplace.commands._env import (
    EnvFlags,
    add_fleet_flags,
    connect,
    fleet_document,
    on_clusters,
    print_document,
)
from gpuplace.commands.gpus import OUTPUTS, add_grid_flags, show, show_fleet
from kubeio.client import Kube


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("status", help="show maps, slots, bound pods, degraded devices")
    add_fleet_flags(EnvFlags(p))
    p.add_argument(
        "--gpus", action="store_true", help="the node x GPU grid instead (as `gpuplace gpus`)"
    )
    add_grid_flags(p)
    p.add_argument("-o", "--output", choices=OUTPUTS, default="text", help="default text")
    p.set_defaults(handler=run)


def collect(kube: Kube, schedulers: list[str]) -> dict[str, Any]:
    """What `status` shows, as data (the JSON and YAML outputs; the text renders the same)."""
    return {
        "maps": [view.to_json() for view in mapviews.map_views(kube)],
        "pods": [dataclasses.asdict(r) for r in inspect.gpuplace_pods(kube, schedulers)],
        "placementPolicy": inspect.placement_policy_exists(kube),
        "degradedDevices": [
            {"node": node, "device": device} for node, device in inspect.degraded_devices(kube)
        ],
    }


def run(args: argparse.Namespace) -> int:
    return on_clusters(args, "status", lambda: run_one(args), lambda c: run_fleet(args, c))


def run_one(args: argparse.Namespace) -> int:
    kube = connect(args)
    if args.gpus:
        print(show(kube, args, args.output))
        return 0
    schedulers = args.schedulers or ["gpuplace", "gpu-scheduler"]
    if args.output != "text":
        print_document(collect(kube, schedulers), args.output)
        return 0
    print("Placement maps")
    print(inspect.table(mapviews.VIEW_HEADERS, mapviews.views_rows(mapviews.map_views(kube))))
    print("\nPods")
    rows = inspect.gpuplace_pods(kube, schedulers)
    print(inspect.pod_table(rows, inspect.mig_inventories(kube, rows)))
    lost = [r for r in rows if r.reason.startswith("BindingUnverifiable")]
    if lost:
        print(
            f"\n{len(lost)} pod(s) bound under a binding key the key ring no longer holds: their "
            "GPUs stay blocked for every other pod. `gpuplace key list` shows them, `gpuplace key "
            "adopt` re-adopts them."
        )
    if not inspect.placement_policy_exists(kube):
        print(
            "\nGrants: no placement policy (PlacementPolicy gpuplace-policy, or ConfigMap "
            "gpuplace-system/gpuplace-policy): unless the controller denies by default, every "
            "namespace whose users may create maps and pods may place on every node and GPU. "
            "Write one for a shared cluster (docs/trust.md, Grants)."
        )
    degraded = inspect.degraded_devices(kube)
    print("\nDegraded devices")
    print(inspect.table(("NODE", "DEVICE"), degraded) if degraded else "none")
    return 0


@dataclasses.dataclass(frozen=True)
class ClusterStatus:
    """What the fleet view reads from one cluster."""

    maps: list[mapviews.MapView]
    pods: list[inspect.PodRow]
    pod_rows: list[tuple[str, ...]]
    policy: bool
    degraded: list[tuple[str, str]]

    @classmethod
    def read(cls, kube: Kube, schedulers: list[str]) -> ClusterStatus:
        pods = inspect.gpuplace_pods(kube, schedulers)
        return cls(
            mapviews.map_views(kube),
            pods,
            inspect.pod_cells(pods, inspect.mig_inventories(kube, pods)),
            inspect.placement_policy_exists(kube),
            inspect.degraded_devices(kube),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "maps": [view.to_json() for view in self.maps],
            "pods": [dataclasses.asdict(r) for r in self.pods],
            "placementPolicy": self.policy,
            "degradedDevices": [{"node": n, "device": d} for n, d in self.degraded],
        }


def _with_cluster(
    readings: list[fleet.Reading[ClusterStatus]],
    width: int,
    rows_of: Any,
) -> list[tuple[str, ...]]:
    """Each reading's rows behind its CLUSTER, or one row UNREACHABLE (the rest "-")."""
    out: list[tuple[str, ...]] = []
    for r in readings:
        if r.value is None:
            out.append((r.cluster, "UNREACHABLE", *("-",) * (width - 1)))
        else:
            out.extend((r.cluster, *row) for row in rows_of(r.value))
    return out


def run_fleet(args: argparse.Namespace, contexts: list[str]) -> int:
    """Every table once, with a CLUSTER column; the clusters read concurrently."""
    if args.gpus:
        print(show_fleet(args, contexts, args.output))
        return 0
    schedulers = args.schedulers or ["gpuplace", "gpu-scheduler"]
    readings = fleet.read_all(
        args.kubeconfig,
        contexts,
        lambda kube: ClusterStatus.read(kube, schedulers),
        args.request_timeout,
    )
    if args.output != "text":
        document = fleet_document(readings, lambda s: s.to_json() if s is not None else {})
        print_document(document, args.output)
        return 0
    headers = mapviews.VIEW_HEADERS
    print("Placement maps")
    maps = _with_cluster(readings, len(headers), lambda s: mapviews.views_rows(s.maps))
    print(inspect.table(("CLUSTER", *headers), maps))
    print("\nPods")
    pods = _with_cluster(readings, len(inspect.POD_HEADERS), lambda s: s.pod_rows)
    print(inspect.table(("CLUSTER", *inspect.POD_HEADERS), pods))
    degraded = _with_cluster(readings, 2, lambda s: s.degraded)
    print("\nDegraded devices")
    print(inspect.table(("CLUSTER", "NODE", "DEVICE"), degraded) if degraded else "none")
    unreachable = [r for r in readings if not r.reachable]
    without_policy = [r.cluster for r in readings if r.value is not None and not r.value.policy]
    if without_policy:
        print(
            f"\nGrants: no placement policy in {', '.join(without_policy)}: unless the controller "
            "denies by default, every namespace may place on every node and GPU there."
        )
    for r in unreachable:
        print(f"\n{r.cluster}: {fleet.unreachable_text(r)}")
    return 0
