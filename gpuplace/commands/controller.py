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

from controller import heap
from controller.builder import build
from controller.settings import BinderSettings, ControllerSettings
from controller.webview import loopback_only
from gpuplace.commands._env import (
    EnvFlags,
    add_enforcement_flags,
    add_kubeconfig_flag,
    add_legacy_flags,
    add_log_flags,
    from_flags,
)
from kubeio import logs
from kubeio.client import ClientSettings, Kube
from placement.dra import DraSettings, Enforcement
from placement.errors import PlacementError
from placement.grants import parse_label_selector

log = logging.getLogger("gpuplace.controller")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("controller", help="run the controller and binder")
    flags = EnvFlags(p)
    add_kubeconfig_flag(flags)
    flags.string("--lease-name", "GPUPLACE_LEASE_NAME", "gpuplace-controller")
    flags.string(
        "--identity",
        "GPUPLACE_IDENTITY",
        "",
        help="leader-election identity (default: hostname + random suffix)",
    )
    flags.string(
        "--namespace",
        "GPUPLACE_NAMESPACE",
        "gpuplace-system",
        help="namespace of the model and the leader Lease",
    )
    flags.string("--inventory-namespace", "GPUPLACE_INVENTORY_NAMESPACE", "gpuplace-inventory")
    _add_binder_flags(flags)
    add_enforcement_flags(flags, dra_details=True)
    flags.number("--lease-seconds", "GPUPLACE_LEASE_SECONDS", 15.0)
    flags.number("--renew-deadline-seconds", "GPUPLACE_RENEW_DEADLINE_SECONDS", 10.0)
    flags.number("--retry-seconds", "GPUPLACE_RETRY_SECONDS", 2.0)
    _add_source_flags(flags)
    flags.string("--metrics-address", "GPUPLACE_METRICS_ADDRESS", "0.0.0.0:8080")
    flags.string(
        "--web-address",
        "GPUPLACE_WEB_ADDRESS",
        "",
        help="serve the read-only web view (grid, maps, waiting pods) on HOST:PORT; off when "
        "empty. A HOST other than localhost (127.0.0.1, ::1) needs --web-authenticate",
    )
    flags.toggle(
        "--web-authenticate",
        "GPUPLACE_WEB_AUTHENTICATE",
        False,
        help="ask the web view's callers for a bearer token, checked with a TokenReview and a "
        "SubjectAccessReview (get services/proxy of --web-service); required for a view that "
        "listens beyond localhost (reached other than by kubectl port-forward)",
    )
    flags.string("--web-service", "GPUPLACE_WEB_SERVICE", "gpuplace-controller")
    # Test hook (see ControllerSettings.startup_delay_seconds), not for production.
    p.add_argument("--startup-delay-seconds", type=float, default=0.0, help=argparse.SUPPRESS)
    add_log_flags(flags)
    p.set_defaults(handler=run)


def _add_binder_flags(flags: EnvFlags) -> None:
    flags.string("--scheduler-name", "GPUPLACE_SCHEDULER_NAME", "gpuplace")
    add_legacy_flags(flags, "place", ["gpu-scheduler"])
    flags.string(
        "--legacy-namespace-selector",
        "GPUPLACE_LEGACY_NAMESPACE_SELECTOR",
        "",
        help="a label selector over namespaces (YAML or JSON: matchLabels, matchExpressions) "
        "whose pods are placed by a gpu-scheduling-map annotation of their own; empty: every "
        "namespace (the chart passes global.legacy.namespaceSelector, as its webhook uses it)",
    )
    flags.string("--node-alias-label", "GPUPLACE_NODE_ALIAS_LABEL", "gpu-node-name")
    flags.string(
        "--grants-default",
        "GPUPLACE_GRANTS_DEFAULT",
        "allow",
        choices=("allow", "deny"),
        help="what a namespace that no grant of the placement policy (ConfigMap gpuplace-policy) "
        "names may do: place anywhere (allow, the default) or nowhere (deny)",
    )
    flags.toggle(
        "--require-inventory",
        "GPUPLACE_REQUIRE_INVENTORY",
        True,
        help="bind only to devices an agent has reported present and healthy",
    )
    flags.integer(
        "--bind-workers",
        "GPUPLACE_BIND_WORKERS",
        BinderSettings().bind_workers,
        help="pods/binding calls in flight from the leader's request loop, one keep-alive "
        "connection each (default %(default)s)",
    )


def _add_source_flags(flags: EnvFlags) -> None:
    flags.toggle(
        "--configmap-maps",
        "GPUPLACE_CONFIGMAP_MAPS",
        True,
        help="read maps from ConfigMaps labelled gpuplace.io/placement-map=true (off: the chart's "
        "maps.configMaps.enabled=false, which also narrows the controller's RBAC)",
    )
    flags.toggle(
        "--resource-maps",
        "GPUPLACE_RESOURCE_MAPS",
        True,
        help="read maps and the placement policy from their custom resources (CRDs "
        "placementmaps.gpuplace.io, placementpolicies.gpuplace.io)",
    )


def settings_from(args: argparse.Namespace) -> ControllerSettings:
    """The settings the flags say; raises PlacementError, located at the flag, for a legacy
    namespace selector that is not one."""
    host, _, port = str(args.metrics_address).rpartition(":")
    legacy_names = tuple(args.legacy_names)
    selector_text = str(args.legacy_namespace_selector or "").strip()
    legacy_selector = (
        parse_label_selector(selector_text, "--legacy-namespace-selector")
        if selector_text
        else None
    )
    return from_flags(
        ControllerSettings,
        args,
        identity=args.identity or f"{socket.gethostname()}-{uuid.uuid4().hex[:6]}",
        system_namespace=args.namespace,
        alias_label=args.node_alias_label,
        metrics_host=host or "0.0.0.0",  # noqa: S104
        metrics_port=int(port),
        binder=from_flags(
            BinderSettings,
            args,
            legacy_scheduler_names=legacy_names,
            legacy_namespace_selector=legacy_selector,
        ),
        enforcement=Enforcement(args.enforcement),
        dra=DraSettings(args.dra_driver, args.dra_attribute, args.dra_device_class),
        grants_default_deny=args.grants_default == "deny",
    )


def run(args: argparse.Namespace) -> int:
    heap.tune()
    try:
        settings = settings_from(args)
    except PlacementError as exc:
        log.error("%s", exc.format())
        return 2
    logs.configure(settings.log_level, settings.log_json)
    if settings.binder.bind_workers < 1:
        log.error("--bind-workers (GPUPLACE_BIND_WORKERS) must be at least 1")
        return 2
    if problem := web_view_problem(settings):
        log.error("%s", problem)
        return 2
    kube = Kube.connect(
        ClientSettings(
            kubeconfig=settings.kubeconfig,
            qps_pool=max(64, settings.binder.bind_workers * 2),
            # Audit logs then say which replica sent each request (a Binding, a Lease renewal).
            user_agent=f"gpuplace-controller/{settings.identity}",
        )
    )
    controller = build(kube, settings)
    controller.start()

    def shutdown(signum: int, _frame: FrameType | None) -> None:
        log.info("signal %d: shutting down", signum)
        controller.stop()

    signal.signal(signal.SIGTERM, shutdown)
    signal.signal(signal.SIGINT, shutdown)
    runner = threading.Thread(target=controller.run, name="controller", daemon=True)
    runner.start()
    while runner.is_alive():
        runner.join(0.5)
    controller.close()
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


def web_view_problem(settings: ControllerSettings) -> str:
    """Why `--web-address` cannot be served as set; "" when it can (or is off)."""
    if not settings.web_address:
        return ""
    host, _, port = settings.web_address.rpartition(":")
    if not port.isdigit():
        return f"--web-address must be HOST:PORT, got {settings.web_address!r}"
    if settings.web_authenticate or loopback_only(host):
        return ""
    return (
        f"--web-address {settings.web_address} listens beyond localhost, where any pod could "
        "read every namespace's maps and pods: add --web-authenticate (GPUPLACE_WEB_AUTHENTICATE; "
        "chart value controller.web.authenticate: true) or listen on 127.0.0.1 only and reach it "
        "with kubectl port-forward"
    )
