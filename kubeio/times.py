"""The two timestamp formats of the Kubernetes API, for the fields gpuplace writes."""

from __future__ import annotations

from datetime import UTC, datetime


def now_time() -> str:
    """RFC 3339 in seconds: `Time` fields (conditions' lastTransitionTime, Event timestamps)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_micro() -> str:
    """RFC 3339 with microseconds: `MicroTime` fields (a Lease's acquireTime and renewTime)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
