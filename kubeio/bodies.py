"""Bodies of the API objects gpuplace writes, built without I/O: one definition of each shape.

Names and fields only; what goes into them (a decision, a lease's timing) is decided elsewhere.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

Obj = dict[str, Any]


def binding(name: str, namespace: str, uid: str, node: str, annotations: Mapping[str, str]) -> Obj:
    """A Binding of pod `namespace/name` to `node`; the apiserver copies its annotations onto the
    pod together with `spec.nodeName`. The uid (when not empty) makes the apiserver refuse the
    bind if the pod was recreated under the same name."""
    metadata: Obj = {"name": name, "namespace": namespace}
    if uid:
        metadata["uid"] = uid
    if annotations:
        metadata["annotations"] = dict(annotations)
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": metadata,
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }


def lease_spec(
    holder: str, duration_seconds: int, acquire_time: str, renew_time: str, transitions: int
) -> Obj:
    """A coordination Lease's spec; the times are MicroTime strings (`kubeio.times.now_micro`)."""
    return {
        "holderIdentity": holder,
        "leaseDurationSeconds": duration_seconds,
        "acquireTime": acquire_time,
        "renewTime": renew_time,
        "leaseTransitions": transitions,
    }


def _named(api_version: str, kind: str, name: str, namespace: str, **fields: Any) -> Obj:
    """An object `namespace/name` of `kind` with `fields` beside its metadata."""
    return {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {"name": name, "namespace": namespace},
        **fields,
    }


def lease(name: str, namespace: str, spec: Obj) -> Obj:
    return _named("coordination.k8s.io/v1", "Lease", name, namespace, spec=spec)


def eviction(name: str, namespace: str, uid: str) -> Obj:
    # Evicts this pod only, not a successor that took its name meanwhile.
    preconditions = {"preconditions": {"uid": uid}}
    return _named("policy/v1", "Eviction", name, namespace, deleteOptions=preconditions)


def delete_options(grace_period_seconds: int | None = None) -> Obj:
    options: Obj = {"apiVersion": "v1", "kind": "DeleteOptions"}
    if grace_period_seconds is not None:
        options["gracePeriodSeconds"] = grace_period_seconds
    return options


def namespace(name: str, labels: Mapping[str, str] | None = None) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, "labels": dict(labels or {})},
    }
