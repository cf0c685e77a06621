"""What a bound pod holds, read from its binding annotations (or, for a pod the earlier tools bound,
its own gpu-scheduling-map line): the one reading of `gpuplace gpus` and the web view."""

from __future__ import annotations

from kubeio.pod import Pod
from placement.annotations import (
    DRIFTED_CONDITION,
    RENUMBERED_CONDITION,
    UNVERIFIABLE_CONDITION,
    decode_binding,
    legacy_map_key,
)
from placement.occupancy import Holder
from placement.podmeta import prebound_line
from placement.types import NodeName


def holder_of(pod: Pod) -> Holder | None:
    """What a bound pod holds by its binding annotations, or by its own gpu-scheduling-map line
    when the earlier tools bound it; None when it is not bound or holds nothing."""
    if not pod.bound:
        return None
    flags = {
        "drifted": _message(pod, DRIFTED_CONDITION),
        "renumbered": _message(pod, RENUMBERED_CONDITION),
        "unverifiable": _message(pod, UNVERIFIABLE_CONDITION),
    }
    node = NodeName(pod.node_name)
    decision = decode_binding(pod.namespace, pod.annotations)
    if decision is not None:
        indices = tuple(
            int(i) for i in decision.cuda_visible_devices.split(",") if i.strip().isdigit()
        )
        return Holder(
            pod.namespace,
            pod.name,
            decision.map.name,
            decision.index,
            node,
            tuple(decision.devices),
            () if decision.devices else indices,
            **flags,
        )
    line = prebound_line(pod)
    if line is None or line.index is None or line.entry is None:
        return None
    devices = line.entry.devices
    return Holder(
        pod.namespace,
        pod.name,
        legacy_map_key(pod.namespace, pod.name).name,
        line.index,
        node,
        tuple(d for d in devices if isinstance(d, str)),
        tuple(d for d in devices if isinstance(d, int)),
        **flags,
    )


def _message(pod: Pod, kind: str) -> str:
    cond = pod.condition(kind)
    return (cond.message or cond.reason or kind) if cond is not None else ""
