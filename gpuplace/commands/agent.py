"""`gpuplace agent`: the NVML node agent (a DaemonSet on GPU nodes).

By default the agent publishes this node's inventory and the checks of the model entries that
target it to ConfigMap `<node>` in the inventory namespace and renews Lease `<node>` there, until
SIGTERM. `--once` does that once and exits. `--once --print` reads this node's GPUs, optionally
checks PlacementMap files against them, prints the result and exits, writing nothing anywhere:
a first look on a GPU node.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import socket
import sys
from pathlib import Path
from types import FrameType

from kubernetes.config import ConfigException

from agent.checks import check_maps
from agent.nvml import NvmlProbe
from agent.probe import EmptyProbe, GpuProbe, NvmlUnavailableError, ProbeError
from agent.report import render_json, render_text
from agent.runner import Agent
from agent.settings import AgentSettings
from gpuplace.commands._env import EnvFlags, add_kubeconfig_flag, add_log_flags, from_flags
from kubeio import logs
from kubeio.client import ClientSettings, Kube
from kubeio.httpserver import OpsServer
from placement.errors import format_all
from placement.inventory import INVENTORY_NAMESPACE, DeviceCheck, NodeInventory
from placement.maps import PlacementMap
from placement.model import MODEL_NAMESPACE
from placement.podresources import KUBELET_POD_RESOURCES_SOCKET
from placement.types import NodeName
from placement.validate import load_maps

PROG = "gpuplace agent"
USAGE = 2  # exit status for unusable flags, as argparse uses

log = logging.getLogger("gpuplace.agent")

EPILOG = """\
exit status: 0 after SIGTERM; 1 when NVML is not available (and --publish-empty was not given) or
the cluster configuration cannot be loaded; 2 for bad flags. With --once: 1 when the inventory could not be
published or the Lease not renewed. With --once --print: 1 when a checked entry failed or a map
file is invalid."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "agent",
        help="run the NVML node agent (DaemonSet on GPU nodes)",
        description="Report this node's GPUs (NVML) and check the placement entries that name it.",
        epilog=EPILOG,
    )
    flags = EnvFlags(p)
    flags.string(
        "--node",
        "NODE_NAME",
        None,
        help="this node's name (default: $NODE_NAME, else the host name)",
    )
    flags.number(
        "--interval",
        "GPUPLACE_AGENT_INTERVAL",
        10.0,
        metavar="SECONDS",
        help="seconds between heartbeats and NVML polls (default 10)",
    )
    flags.number(
        "--xid-recovery-seconds",
        "GPUPLACE_XID_RECOVERY_SECONDS",
        0.0,
        metavar="SECONDS",
        help="a GPU marked unhealthy by a critical XID is healthy again after this long without "
        "another one (default 0: until the agent restarts)",
    )
    flags.switch(
        "--publish-empty",
        env="GPUPLACE_PUBLISH_EMPTY",
        help="publish an empty inventory instead of exiting when this node has no NVML",
    )
    flags.string(
        "--identity",
        "GPUPLACE_IDENTITY",
        None,
        help="holderIdentity of the heartbeat Lease (default: the host name, i.e. the pod name)",
    )
    add_kubeconfig_flag(flags)
    flags.string(
        "--inventory-namespace",
        "GPUPLACE_INVENTORY_NAMESPACE",
        INVENTORY_NAMESPACE,
        help="where the inventory ConfigMap and Lease of this node are written",
    )
    flags.string(
        "--pod-resources-socket",
        "GPUPLACE_POD_RESOURCES_SOCKET",
        KUBELET_POD_RESOURCES_SOCKET,
        help="the kubelet's pod-resources socket: what each pod holds is published beside the "
        "inventory for `gpuplace import` (empty: not read)",
    )
    flags.string(
        "--model-namespace",
        "GPUPLACE_NAMESPACE",
        MODEL_NAMESPACE,
        help="where the compiled model is read from (read-only)",
    )
    flags.string("--metrics-address", "GPUPLACE_METRICS_ADDRESS", "0.0.0.0:8080")
    _add_once_flags(p)
    add_log_flags(flags, None, help="default: info, or warning with --print")
    p.set_defaults(handler=run)


def _add_once_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--once", action="store_true", help="probe and publish once, then exit")
    p.add_argument(
        "--print",
        dest="print_only",
        action="store_true",
        help="print the inventory and check results instead of publishing them (writes nothing)",
    )
    p.add_argument("--output", choices=("text", "json"), default="text", help="with --print")
    p.add_argument(
        "--map",
        dest="maps",
        action="append",
        default=[],
        metavar="FILE",
        help="check the PlacementMaps in FILE against this node (with --print; repeatable)",
    )


def settings_from(args: argparse.Namespace) -> AgentSettings:
    """Raises ValueError naming the flag when a value is unusable."""
    if args.interval <= 0:
        raise ValueError(f"--interval must be a positive number of seconds, got {args.interval}")
    host, _, port = str(args.metrics_address).rpartition(":")
    if not port.isdecimal() or not 0 <= int(port) <= 65535:
        raise ValueError(f"--metrics-address must be HOST:PORT, got {args.metrics_address!r}")
    if str(args.inventory_namespace) == str(args.model_namespace):
        raise ValueError(
            f"--inventory-namespace and --model-namespace are both {args.model_namespace!r}: "
            "agents may write the inventory namespace, so the model must live elsewhere"
        )
    if args.xid_recovery_seconds < 0:
        raise ValueError(
            f"--xid-recovery-seconds must be 0 or more seconds, got {args.xid_recovery_seconds}"
        )
    return from_flags(
        AgentSettings,
        args,
        node=NodeName(args.node or socket.gethostname()),
        interval_seconds=float(args.interval),
        identity=str(args.identity or socket.gethostname()),
        metrics_host=host or "0.0.0.0",  # noqa: S104 - a pod's metrics port listens on all interfaces
        metrics_port=int(port),
        log_level=str(args.log_level or ("warning" if args.print_only else "info")),
        pod_resources_socket=str(args.pod_resources_socket or ""),
    )


def run(args: argparse.Namespace) -> int:
    try:
        settings = settings_from(args)
    except ValueError as exc:
        return _fail(str(exc), USAGE)
    if not args.print_only:
        if args.maps:
            return _fail("--map needs --print: the running agent checks the cluster's model", USAGE)
        logs.configure(settings.log_level, settings.log_json)
        return publish(settings, once=bool(args.once))
    if not args.once:
        return _fail("--print needs --once: printing happens once, then the agent exits", USAGE)
    logs.configure(settings.log_level, settings.log_json)
    return print_once(settings, [Path(m) for m in args.maps], args.output)


def publish(settings: AgentSettings, *, once: bool) -> int:
    """Publishes this node's inventory until SIGTERM (or once)."""
    probe = _open_probe(settings)
    if probe is None:
        return 1
    try:
        try:
            kube = Kube.connect(
                ClientSettings(kubeconfig=settings.kubeconfig, qps_pool=4, user_agent=PROG)
            )
        except (ConfigException, OSError, ValueError) as exc:
            where = f"--kubeconfig {settings.kubeconfig}" if settings.kubeconfig else "in-cluster"
            return _fail(f"cannot load the cluster configuration ({where}): {exc}")
        agent = Agent(kube, probe, settings)
        if once:
            return 0 if agent.run_once() else 1
        try:
            ops = OpsServer(
                settings.metrics_host,
                settings.metrics_port,
                agent.metrics.registry,
                ready=agent.is_ready,
                healthy=agent.healthy,
            ).start()
        except OSError as exc:
            return _fail(
                f"cannot listen on {settings.metrics_host}:{settings.metrics_port} "
                f"(--metrics-address): {exc}"
            )
        log.info(
            "agent %s serving /healthz, /readyz, /metrics on port %d", settings.identity, ops.port
        )

        def shutdown(signum: int, _frame: FrameType | None) -> None:
            log.info("signal %d: stopping", signum)
            agent.stop()

        signal.signal(signal.SIGTERM, shutdown)
        signal.signal(signal.SIGINT, shutdown)
        try:
            agent.run()
        finally:
            agent.close()
            ops.stop()
        log.info("agent stopped")
        return 0
    finally:
        probe.close()


def _open_probe(settings: AgentSettings) -> GpuProbe | None:
    try:
        return NvmlProbe(xid_recovery_seconds=settings.xid_recovery_seconds)
    except NvmlUnavailableError as exc:
        if not settings.publish_empty:
            _fail(str(exc))
            return None
        log.warning(
            "NVML is not available on this node (%s); publishing an empty inventory "
            "(--publish-empty)",
            exc.reason,
        )
        return EmptyProbe()
    except ProbeError as exc:
        _fail(str(exc))
        return None


def print_once(settings: AgentSettings, map_files: list[Path], output: str) -> int:
    maps = _load_maps(map_files)
    if maps is None:
        return 1
    try:
        with contextlib.closing(NvmlProbe()) as probe:
            inventory = probe.snapshot(settings.node)
    except NvmlUnavailableError as exc:
        if not settings.publish_empty:
            return _fail(str(exc))
        print(
            f"{PROG}: warning: NVML is not available on this node ({exc.reason}); "
            "the inventory is empty (--publish-empty)",
            file=sys.stderr,
        )
        inventory = NodeInventory(settings.node)
    except ProbeError as exc:
        return _fail(str(exc))
    checks: tuple[DeviceCheck, ...] = check_maps(inventory, maps) if map_files else ()
    if output == "json":
        print(render_json(inventory, checks))
    else:
        print(render_text(inventory, checks, maps_checked=bool(map_files)))
    return 0 if all(c.ok for c in checks) else 1


def _load_maps(files: list[Path]) -> list[PlacementMap] | None:
    maps: list[PlacementMap] = []
    failed = False
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            print(f"{path}: error: cannot read the file: {exc}", file=sys.stderr)
            failed = True
            continue
        result = load_maps(text, str(path))
        if result.diagnostics:
            print(format_all(result.diagnostics), file=sys.stderr)
            failed = True
        elif not result.maps:
            print(f"{path}: error: no PlacementMap in this file", file=sys.stderr)
            failed = True
        maps.extend(result.maps)
    return None if failed else maps


def _fail(message: str, status: int = 1) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return status
