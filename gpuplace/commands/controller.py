"""`gpuplace controller`: validates and compiles placement maps and binds pods (leader-elected)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import threading
import uuid
from types import FrameType

from controller.manager import Controller
from controller.settings import BinderSettings, ControllerSettings, GitSourceSettings
from gpuplace.commands._env import (
    add_enforcement_flags,
    env_bool,
    env_float,
    env_int,
    env_list,
    env_str,
)
from kubeio import logs
from kubeio.client import ClientSettings, Kube
from kubeio.httpserver import OpsServer
from placement.dra import DraSettings, Enforcement

log = logging.getLogger("gpuplace.controller")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("controller", help="run the controller and binder")
    p.add_argument("--kubeconfig", default=env_str("KUBECONFIG", None))
    p.add_argument("--lease-name", default=env_str("GPUPLACE_LEASE_NAME", "gpuplace-controller"))
    p.add_argument(
        "--identity",
        default=env_str("GPUPLACE_IDENTITY", ""),
        help="leader-election identity (default: hostname + random suffix)",
    )
    p.add_argument(
        "--namespace",
        default=env_str("GPUPLACE_NAMESPACE", "gpuplace-system"),
        help="namespace of the model and the leader Lease",
    )
    p.add_argument(
        "--inventory-namespace",
        default=env_str("GPUPLACE_INVENTORY_NAMESPACE", "gpuplace-inventory"),
    )
    p.add_argument("--scheduler-name", default=env_str("GPUPLACE_SCHEDULER_NAME", "gpuplace"))
    p.add_argument(
        "--legacy",
        action=argparse.BooleanOptionalAction,
        default=env_bool("GPUPLACE_LEGACY", True),
        help="also place pods carrying the gpu-scheduling-map annotation",
    )
    p.add_argument(
        "--legacy-scheduler-name",
        action="append",
        dest="legacy_names",
        default=None,
        help="schedulerName of legacy pods (repeatable; default gpu-scheduler)",
    )
    p.add_argument(
        "--node-alias-label", default=env_str("GPUPLACE_NODE_ALIAS_LABEL", "gpu-node-name")
    )
    p.add_argument(
        "--grants-default",
        choices=("allow", "deny"),
        default=env_str("GPUPLACE_GRANTS_DEFAULT", "allow"),
        help="what a namespace that no grant of the placement policy (ConfigMap gpuplace-policy) "
        "names may do: place anywhere (allow, the default) or nowhere (deny)",
    )
    p.add_argument(
        "--require-inventory",
        action=argparse.BooleanOptionalAction,
        default=env_bool("GPUPLACE_REQUIRE_INVENTORY", True),
        help="bind only to devices an agent has reported present and healthy",
    )
    p.add_argument(
        "--bind-workers",
        type=int,
        default=env_int("GPUPLACE_BIND_WORKERS", BinderSettings().bind_workers),
        help="concurrent pods/binding calls (default %(default)s)",
    )
    add_enforcement_flags(p, dra_details=True)
    p.add_argument("--lease-seconds", type=float, default=env_float("GPUPLACE_LEASE_SECONDS", 15.0))
    p.add_argument(
        "--renew-deadline-seconds",
        type=float,
        default=env_float("GPUPLACE_RENEW_DEADLINE_SECONDS", 10.0),
    )
    p.add_argument("--retry-seconds", type=float, default=env_float("GPUPLACE_RETRY_SECONDS", 2.0))
    p.add_argument(
        "--source", choices=("configmap", "git"), default=env_str("GPUPLACE_SOURCE", "configmap")
    )
    p.add_argument("--repo", default=env_str("GPUPLACE_GIT_REPO", ""))
    p.add_argument("--branch", default=env_str("GPUPLACE_GIT_BRANCH", "main"))
    p.add_argument("--path", default=env_str("GPUPLACE_GIT_PATH", ""))
    p.add_argument(
        "--git-interval-seconds",
        type=float,
        default=env_float("GPUPLACE_GIT_INTERVAL_SECONDS", 15.0),
    )
    p.add_argument("--metrics-address", default=env_str("GPUPLACE_METRICS_ADDRESS", "0.0.0.0:8080"))
    # Test hook (see ControllerSettings.startup_delay_seconds), not for production.
    p.add_argument("--startup-delay-seconds", type=float, default=0.0, help=argparse.SUPPRESS)
    p.add_argument("--log-level", default=env_str("GPUPLACE_LOG_LEVEL", "info"))
    p.add_argument("--log-json", action="store_true", default=env_bool("GPUPLACE_LOG_JSON", False))
    p.set_defaults(handler=run)


def settings_from(args: argparse.Namespace) -> ControllerSettings:
    host, _, port = str(args.metrics_address).rpartition(":")
    legacy_names = tuple(
        args.legacy_names or env_list("GPUPLACE_LEGACY_SCHEDULER_NAMES", ["gpu-scheduler"])
    )
    return ControllerSettings(
        kubeconfig=args.kubeconfig,
        identity=args.identity or f"{socket.gethostname()}-{uuid.uuid4().hex[:6]}",
        system_namespace=args.namespace,
        lease_name=args.lease_name,
        inventory_namespace=args.inventory_namespace,
        lease_seconds=args.lease_seconds,
        renew_deadline_seconds=args.renew_deadline_seconds,
        retry_seconds=args.retry_seconds,
        alias_label=args.node_alias_label,
        source=args.source,
        git=GitSourceSettings(args.repo, args.branch, args.path, args.git_interval_seconds),
        metrics_host=host or "0.0.0.0",  # noqa: S104
        metrics_port=int(port),
        binder=BinderSettings(
            scheduler_name=args.scheduler_name,
            legacy_scheduler_names=legacy_names,
            legacy=args.legacy,
            require_inventory=args.require_inventory,
            bind_workers=args.bind_workers,
        ),
        enforcement=Enforcement(args.enforcement),
        dra=DraSettings(args.dra_driver, args.dra_attribute, args.dra_device_class),
        startup_delay_seconds=args.startup_delay_seconds,
        log_level=args.log_level,
        log_json=args.log_json,
        grants_default_deny=args.grants_default == "deny",
    )


def run(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    logs.configure(settings.log_level, settings.log_json)
    if settings.source == "git" and not settings.git.repo:
        log.error("--source git needs --repo URL (and optionally --branch, --path)")
        return 2
    kube = Kube.connect(
        ClientSettings(
            kubeconfig=settings.kubeconfig,
            qps_pool=max(64, settings.binder.bind_workers * 2),
            # Audit logs then say which replica sent each request (a Binding, a Lease renewal).
            user_agent=f"gpuplace-controller/{settings.identity}",
        )
    )
    controller = Controller(kube, settings)
    ops = OpsServer(
        settings.metrics_host,
        settings.metrics_port,
        controller.metrics.registry,
        ready=lambda: controller.ready.is_set() or not controller.elector.is_leader.is_set(),
        healthy=controller.healthy,
    )
    ops.start()
    log.info("controller %s starting; metrics on port %d", settings.identity, ops.port)

    def shutdown(signum: int, _frame: FrameType | None) -> None:
        log.info("signal %d: shutting down", signum)
        controller.stop()

    signal.signal(signal.SIGTERM, shutdown)
    signal.signal(signal.SIGINT, shutdown)
    runner = threading.Thread(target=controller.run, name="controller", daemon=True)
    runner.start()
    while runner.is_alive():
        runner.join(0.5)
    ops.stop()
    if controller.lost_leadership.is_set():
        log.error(
            "leadership lost (the apiserver could not be reached to renew the lease within "
            "%.0f s, or another replica holds it); exiting with status 1 rather than acting on "
            "a stale cache. In a Deployment the kubelet restarts this container and it campaigns "
            "again; run by hand, start `gpuplace controller` again (it rebuilds everything from "
            "the apiserver) or run it under a supervisor that restarts it",
            settings.renew_deadline_seconds,
        )
        os._exit(1)
    return 0
