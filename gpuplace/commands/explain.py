"""`gpuplace explain POD`: why a pod is where it is, or why it is Pending."""

from __future__ import annotations

import argparse

from gpuplace import inspect
from gpuplace.commands._env import EnvFlags, add_kubeconfig_flag
from kubeio.client import ClientSettings, Kube


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("explain", help="why a pod is where it is, or why it is Pending")
    p.add_argument("pod", help="POD or NAMESPACE/POD")
    p.add_argument("-n", "--namespace", default="default")
    add_kubeconfig_flag(EnvFlags(p))
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    namespace, _, name = str(args.pod).rpartition("/")
    kube = Kube.connect(ClientSettings(kubeconfig=args.kubeconfig))
    text = inspect.explain(kube, namespace or args.namespace, name)
    print(text)
    return 1 if text.endswith("not found") else 0
