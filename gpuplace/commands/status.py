"""`gpuplace status`: maps, slots, bound pods and degraded devices of a cluster, as tables (or
`-o json|yaml`); `--gpus` shows the node x GPU grid of `gpuplace gpus` instead.

Maps are listed in both forms: FORM `resource` for a PlacementMap custom resource, `configmap` for
a labelled ConfigMap; a ConfigMap that a custom resource of the same content supersedes shows
PHASE Superseded (it can be deleted)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any

import yaml

from gpuplace import inspect, mapviews
from gpuplace.commands._env import EnvFlags, add_cluster_flags, connect
from gpuplace.commands.gpus import OUTPUTS, add_grid_flags, show
from kubeio.client import Kube


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("status", help="show maps, slots, bound pods, degraded devices")
    add_cluster_flags(EnvFlags(p))
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
    kube = connect(args)
    if args.gpus:
        print(show(kube, args, args.output))
        return 0
    schedulers = args.schedulers or ["gpuplace", "gpu-scheduler"]
    if args.output != "text":
        data = collect(kube, schedulers)
        if args.output == "json":
            json.dump(data, sys.stdout, indent=2)
            print()
        else:
            print(yaml.safe_dump(data, sort_keys=False).rstrip())
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
