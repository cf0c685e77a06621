"""`gpuplace status`: maps, slots, bound pods and degraded devices of a cluster, as tables."""

from __future__ import annotations

import argparse

from gpuplace import inspect
from gpuplace.commands._env import EnvFlags, add_kubeconfig_flag
from kubeio.client import ClientSettings, Kube


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("status", help="show maps, slots, bound pods, degraded devices")
    add_kubeconfig_flag(EnvFlags(p))
    p.add_argument(
        "--scheduler-name",
        action="append",
        dest="schedulers",
        help="binder schedulerName(s) whose pods to list (default gpuplace, gpu-scheduler)",
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    kube = Kube.connect(ClientSettings(kubeconfig=args.kubeconfig))
    print("Placement maps")
    print(inspect.map_table(inspect.map_statuses(kube)))
    print("\nPods")
    rows = inspect.gpuplace_pods(kube, args.schedulers or ["gpuplace", "gpu-scheduler"])
    print(inspect.pod_table(rows))
    lost = [r for r in rows if r.reason.startswith("BindingUnverifiable")]
    if lost:
        print(
            f"\n{len(lost)} pod(s) bound under a binding key the key ring no longer holds: their "
            "GPUs stay blocked for every other pod. `gpuplace key list` shows them, `gpuplace key "
            "adopt` re-adopts them."
        )
    if not inspect.placement_policy_exists(kube):
        print(
            "\nGrants: no placement policy (ConfigMap gpuplace-system/gpuplace-policy): unless the "
            "controller denies by default, every namespace whose users may create ConfigMaps and "
            "pods may place on every node and GPU. Write one for a shared cluster (README, Grants)."
        )
    degraded = inspect.degraded_devices(kube)
    print("\nDegraded devices")
    print(inspect.table(("NODE", "DEVICE"), degraded) if degraded else "none")
    return 0
