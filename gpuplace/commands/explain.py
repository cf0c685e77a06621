"""`gpuplace explain POD`: why a pod is where it is, or why it is Pending."""

from __future__ import annotations

import argparse
import json

import yaml

from gpuplace import inspect
from gpuplace.commands._env import EnvFlags, add_cluster_flags, connect
from gpuplace.commands.gpus import OUTPUTS


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("explain", help="why a pod is where it is, or why it is Pending")
    p.add_argument("pod", help="POD or NAMESPACE/POD")
    p.add_argument("-n", "--namespace", default="default")
    add_cluster_flags(EnvFlags(p))
    p.add_argument("-o", "--output", choices=OUTPUTS, default="text", help="default text")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    namespace, _, name = str(args.pod).rpartition("/")
    namespace = namespace or args.namespace
    found = inspect.explanation(connect(args), namespace, name)
    if found is None:
        print(f"pod {namespace}/{name} not found")
        return 1
    if args.output == "json":
        print(json.dumps(found.to_dict(), indent=2))
    elif args.output == "yaml":
        print(yaml.safe_dump(found.to_dict(), sort_keys=False).rstrip())
    else:
        print("\n".join(found.lines()))
    return 0
