"""GPUPLACE_* environment defaults for command-line flags (flags win over the environment)."""

from __future__ import annotations

import argparse
import os

from placement.dra import DEFAULT_ATTRIBUTE, DEFAULT_DEVICE_CLASS, DEFAULT_DRIVER, Enforcement


def env_str(name: str, default: str | None) -> str | None:
    value = os.environ.get(name)
    return value if value not in (None, "") else default


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name, "").strip().lower()
    if not value:
        return default
    return value in ("1", "true", "yes", "on")


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "").strip()
    return int(value) if value else default


def env_float(name: str, default: float) -> float:
    value = os.environ.get(name, "").strip()
    return float(value) if value else default


def env_list(name: str, default: list[str]) -> list[str]:
    value = os.environ.get(name, "").strip()
    return [v.strip() for v in value.split(",") if v.strip()] if value else default


def add_enforcement_flags(parser: argparse.ArgumentParser, dra_details: bool) -> None:
    """`--enforcement` (and, for the binder, how declared devices are found in ResourceSlices)."""
    parser.add_argument(
        "--enforcement",
        choices=[e.value for e in Enforcement],
        default=env_str("GPUPLACE_ENFORCEMENT", Enforcement.ENV.value),
        help="env: CUDA_VISIBLE_DEVICES from the binding (selects GPUs, isolates nothing); "
        "dra: each pod's ResourceClaim is allocated to its declared devices (default %(default)s)",
    )
    if not dra_details:
        return
    parser.add_argument(
        "--dra-driver",
        default=env_str("GPUPLACE_DRA_DRIVER", DEFAULT_DRIVER),
        help="DRA driver whose ResourceSlices list the GPUs (default %(default)s)",
    )
    parser.add_argument(
        "--dra-attribute",
        default=env_str("GPUPLACE_DRA_ATTRIBUTE", DEFAULT_ATTRIBUTE),
        help="device attribute holding the GPU UUID (default %(default)s)",
    )
    parser.add_argument(
        "--dra-device-class",
        default=env_str("GPUPLACE_DRA_DEVICE_CLASS", DEFAULT_DEVICE_CLASS),
        help="DeviceClass the claim templates request (default %(default)s)",
    )
