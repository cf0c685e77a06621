"""Command-line flags whose defaults come from the environment (a flag given wins).

Every component command declares its flags through `EnvFlags`, so each `GPUPLACE_*` variable is
read one way: when the parser is built, as the flag's default. The settings objects are then built
from the parsed flags alone (`from_flags`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import yaml

from gpuplace import fleet
from kubeio.client import ClientSettings, Kube
from placement.dra import DEFAULT_ATTRIBUTE, DEFAULT_DEVICE_CLASS, DEFAULT_DRIVER, Enforcement

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

#: The parser, or one of its argument groups (both have add_argument).
Parser = argparse.ArgumentParser | argparse._ArgumentGroup


def env_str(name: str, default: str | None) -> str | None:
    value = os.environ.get(name)
    return value if value not in (None, "") else default


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name, "").strip().lower()
    if not value:
        return default
    return value in ("1", "true", "yes", "on")


_N = TypeVar("_N", int, float)
T = TypeVar("T")
S = TypeVar("S", bound="DataclassInstance")


def from_flags(settings: type[S], args: argparse.Namespace, **fields: Any) -> S:
    """A `settings` dataclass whose fields are the parsed flags of the same name
    (``--lease-seconds`` fills ``lease_seconds``), or `fields`, which name the others: one that
    a flag of another name fills, a value converted from a flag, a nested settings object. A
    field that neither names keeps its default."""
    flagged = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(settings)
        if f.init and f.name not in fields and hasattr(args, f.name)
    }
    return settings(**flagged, **fields)


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "").strip()
    return _number(name, value, int) if value else default


def env_float(name: str, default: float) -> float:
    value = os.environ.get(name, "").strip()
    return _number(name, value, float) if value else default


def _number(name: str, value: str, kind: type[_N]) -> _N:
    try:
        return kind(value)
    except ValueError:
        hint = ""
        if value.startswith("tcp://"):
            hint = (
                " (a Kubernetes service-link variable of a Service with that name: set "
                "enableServiceLinks: false on the pod)"
            )
        raise SystemExit(
            f"gpuplace: environment variable {name}={value!r} is not a {kind.__name__}{hint}"
        ) from None


def env_list(name: str, default: list[str]) -> list[str]:
    value = os.environ.get(name, "").strip()
    return [v.strip() for v in value.split(",") if v.strip()] if value else default


class _AppendOverDefault(argparse.Action):
    """`append` whose first use replaces the default (from the environment) instead of adding to
    it: `--x a --x b` gives [a, b] whatever the variable holds."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        current = getattr(namespace, self.dest)
        items = [] if current is self.default else list(current)
        items.append(values)
        setattr(namespace, self.dest, items)


class EnvFlags:
    """Adds flags to `parser` whose default is the environment variable `env`, else `default`."""

    def __init__(self, parser: Parser) -> None:
        self.parser = parser

    def string(self, flag: str, env: str, default: str | None, **kwargs: Any) -> None:
        self.parser.add_argument(flag, default=env_str(env, default), **kwargs)

    def integer(self, flag: str, env: str, default: int, **kwargs: Any) -> None:
        self.parser.add_argument(flag, type=int, default=env_int(env, default), **kwargs)

    def number(self, flag: str, env: str, default: float, **kwargs: Any) -> None:
        self.parser.add_argument(flag, type=float, default=env_float(env, default), **kwargs)

    def switch(self, *flags: str, env: str, **kwargs: Any) -> None:
        """A flag that turns something on (`--x`); the variable may turn it on too."""
        self.parser.add_argument(
            *flags, action="store_true", default=env_bool(env, False), **kwargs
        )

    def toggle(self, flag: str, env: str, default: bool, **kwargs: Any) -> None:
        """`--x` / `--no-x`."""
        self.parser.add_argument(
            flag, action=argparse.BooleanOptionalAction, default=env_bool(env, default), **kwargs
        )

    def repeated(self, flag: str, env: str, default: list[str], **kwargs: Any) -> None:
        """A repeatable flag; the variable holds a comma-separated list."""
        self.parser.add_argument(
            flag, action=_AppendOverDefault, default=env_list(env, default), **kwargs
        )


def add_kubeconfig_flag(flags: EnvFlags) -> None:
    flags.string("--kubeconfig", "KUBECONFIG", None)


def add_cluster_flags(flags: EnvFlags) -> None:
    """`--kubeconfig` and `--context`, for the commands that read a cluster."""
    add_kubeconfig_flag(flags)
    flags.string(
        "--context", "GPUPLACE_CONTEXT", None, help="kubeconfig context (default: current-context)"
    )


def add_fleet_flags(flags: EnvFlags) -> None:
    """`--kubeconfig`, `--context` (repeatable: one cluster each) and `--all-contexts`, for the
    commands that read one cluster or several at once (`gpuplace.fleet`)."""
    add_kubeconfig_flag(flags)
    flags.repeated(
        "--context",
        "GPUPLACE_CONTEXT",
        [],
        metavar="CONTEXT",
        help="kubeconfig context (default: current-context); repeat it to read several clusters "
        "into one table with a CLUSTER column",
    )
    flags.parser.add_argument(
        "--all-contexts",
        action="store_true",
        help="read every context of the kubeconfig (one cluster each)",
    )
    flags.number(
        "--request-timeout",
        "GPUPLACE_REQUEST_TIMEOUT",
        30.0,
        metavar="SECONDS",
        help="how long to wait for a cluster's answer; in a fleet read, one that does not answer "
        "is shown unreachable (default %(default)s)",
    )


def fleet_contexts(args: argparse.Namespace) -> list[str] | None:
    """The contexts `add_fleet_flags` named, when the command reads a fleet (several
    `--context`, or `--all-contexts`); None when it reads one cluster (`connect`)."""
    contexts: list[str] = list(dict.fromkeys(args.context))
    if args.all_contexts or len(contexts) > 1:
        return [
            c for c in fleet.contexts_to_read(args.kubeconfig, contexts, args.all_contexts) if c
        ]
    return None


def on_clusters(
    args: argparse.Namespace,
    command: str,
    one: Callable[[], int],
    many: Callable[[list[str]], int],
) -> int:
    """`many(contexts)` when the fleet flags name several clusters, else `one()`; contexts the
    kubeconfig does not have are an error of `command` (exit 1)."""
    try:
        contexts = fleet_contexts(args)
    except ValueError as exc:
        print(f"gpuplace {command}: error: {exc}", file=sys.stderr)
        return 1
    return one() if contexts is None else many(contexts)


def print_document(data: object, output: str) -> None:
    """`data` as `-o json` or `-o yaml` prints it."""
    if output == "json":
        print(json.dumps(data, indent=2))
    else:
        print(yaml.safe_dump(data, sort_keys=False).rstrip())


def fleet_document(
    readings: Sequence[fleet.Reading[T]], fields: Callable[[T | None], dict[str, Any]]
) -> dict[str, Any]:
    """A fleet read as `-o json|yaml` prints it: an entry per cluster, whether it answered and
    why not, and `fields` of its value (None when it did not answer or has nothing)."""
    return {
        "clusters": [
            {"cluster": r.cluster, "reachable": r.reachable, "error": r.error, **fields(r.value)}
            for r in readings
        ]
    }


def connect(args: argparse.Namespace) -> Kube:
    """A client for the cluster `add_cluster_flags` (or `add_fleet_flags`, one context) named."""
    context = args.context
    if isinstance(context, list):
        context = context[0] if context else None
    settings = ClientSettings(kubeconfig=args.kubeconfig, context=context)
    timeout = getattr(args, "request_timeout", None)
    if timeout:
        settings = dataclasses.replace(settings, timeout_seconds=timeout)
    return Kube.connect(settings)


def add_log_flags(flags: EnvFlags, level: str | None = "info", **level_kwargs: Any) -> None:
    flags.string("--log-level", "GPUPLACE_LOG_LEVEL", level, **level_kwargs)
    flags.switch("--log-json", env="GPUPLACE_LOG_JSON")


def add_legacy_flags(flags: EnvFlags, what: str, scheduler_names: list[str]) -> None:
    """`--legacy` (`what`: what the component does with legacy pods) and their scheduler names."""
    flags.toggle(
        "--legacy",
        "GPUPLACE_LEGACY",
        True,
        help=f"also {what} pods carrying the gpu-scheduling-map annotation",
    )
    flags.repeated(
        "--legacy-scheduler-name",
        "GPUPLACE_LEGACY_SCHEDULER_NAMES",
        scheduler_names,
        dest="legacy_names",
        help="schedulerName of legacy pods (repeatable; default gpu-scheduler)",
    )


def add_enforcement_flags(flags: EnvFlags, dra_details: bool) -> None:
    """`--enforcement` (and, for the binder, how declared devices are found in ResourceSlices)."""
    flags.string(
        "--enforcement",
        "GPUPLACE_ENFORCEMENT",
        Enforcement.ENV.value,
        choices=[e.value for e in Enforcement],
        help="env: CUDA_VISIBLE_DEVICES from the binding (selects GPUs, isolates nothing); "
        "dra: each pod's ResourceClaim is allocated to its declared devices (default %(default)s)",
    )
    if not dra_details:
        return
    flags.string(
        "--dra-driver",
        "GPUPLACE_DRA_DRIVER",
        DEFAULT_DRIVER,
        help="DRA driver whose ResourceSlices list the GPUs (default %(default)s)",
    )
    flags.string(
        "--dra-attribute",
        "GPUPLACE_DRA_ATTRIBUTE",
        DEFAULT_ATTRIBUTE,
        help="device attribute holding the GPU UUID (default %(default)s)",
    )
    flags.string(
        "--dra-device-class",
        "GPUPLACE_DRA_DEVICE_CLASS",
        DEFAULT_DEVICE_CLASS,
        help="DeviceClass the claim templates request (default %(default)s)",
    )
