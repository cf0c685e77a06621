"""`gpuplace explain POD`: why a pod is where it is, or why it is Pending.

Several clusters (`--context a --context b`, `--all-contexts`): the pod is looked up in each at
once; every cluster that has it explains it under its name, one that does not answer says so."""

from __future__ import annotations

import argparse

from gpuplace import fleet, inspect
from gpuplace.commands._env import (
    EnvFlags,
    add_fleet_flags,
    connect,
    fleet_document,
    on_clusters,
    print_document,
)
from gpuplace.commands.gpus import OUTPUTS


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("explain", help="why a pod is where it is, or why it is Pending")
    p.add_argument("pod", help="POD or NAMESPACE/POD")
    p.add_argument("-n", "--namespace", default="default")
    add_fleet_flags(EnvFlags(p))
    p.add_argument("-o", "--output", choices=OUTPUTS, default="text", help="default text")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    namespace, _, name = str(args.pod).rpartition("/")
    namespace = namespace or args.namespace
    return on_clusters(
        args,
        "explain",
        lambda: run_one(args, namespace, name),
        lambda contexts: run_fleet(args, contexts, namespace, name),
    )


def run_one(args: argparse.Namespace, namespace: str, name: str) -> int:
    found = inspect.explanation(connect(args), namespace, name)
    if found is None:
        print(f"pod {namespace}/{name} not found")
        return 1
    if args.output == "text":
        print("\n".join(found.lines()))
    else:
        print_document(found.to_dict(), args.output)
    return 0


def run_fleet(args: argparse.Namespace, contexts: list[str], namespace: str, name: str) -> int:
    """Exit 0 when some cluster has the pod, 1 when none that answered has it."""
    readings = fleet.read_all(
        args.kubeconfig,
        contexts,
        lambda kube: inspect.explanation(kube, namespace, name),
        args.request_timeout,
    )
    if args.output != "text":
        document = fleet_document(
            readings,
            lambda found: {
                "found": found is not None,
                "explanation": found.to_dict() if found is not None else None,
            },
        )
        print_document(document, args.output)
    else:
        for r in readings:
            if not r.reachable:
                print(f"[{r.cluster}] {fleet.unreachable_text(r)}")
            elif r.value is None:
                print(f"[{r.cluster}] pod {namespace}/{name} not found")
            else:
                print("\n".join(f"[{r.cluster}] {line}" for line in r.value.lines()))
    return 0 if any(r.value is not None for r in readings) else 1
