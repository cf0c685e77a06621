"""`gpuplace demo`: the whole GitOps flow on a local control plane (what `make demo` runs)."""

from __future__ import annotations

import argparse

from gpuplace_dev.demo.scenario import main


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("demo", help="run the whole flow on a local control plane")
    p.add_argument(
        "--keep",
        action="store_true",
        help="leave the cluster and components up and print the KUBECONFIG export",
    )
    p.add_argument(
        "--argocd",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="sync through real ArgoCD (application-controller, repo-server, "
        "applicationset-controller, built the first time; default): with the real node, ArgoCD "
        "first installs gpuplace's chart from git (the image built here), then syncs the maps; "
        "--no-argocd syncs with kustomize and kubectl apply, controller and webhook as local "
        "processes",
    )
    p.add_argument(
        "--kwok-only",
        action="store_true",
        help="no real node: every pod on kwok nodes (no containers start; quicker, no root)",
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    return main(keep=bool(args.keep), argocd=args.argocd, real_node=not args.kwok_only)
