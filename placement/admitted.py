"""Whether a map's pod was admitted by gpuplace's webhook, judged from what the pod carries.

A pod labelled `gpuplace.io/map` is placed only as the webhook judged it at create (its map, its
rank, spec.nodeName unset, its claims). A pod can carry the label without meeting the webhook:
created unlabelled (the webhook's objectSelector skips it) and labelled afterwards where the
pod-bindings admission policy is not installed, or created while the webhook configuration was
missing. The webhook leaves a mark nobody else can leave on a labelled pod: every init container
and container gets `CUDA_VISIBLE_DEVICES` from the binding's annotation, and the pod-bindings
policy refuses that variable in any other form on a labelled pod and refuses the label added
after create. The binder places only pods with the mark (docs/trust.md, "the map label").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from placement.annotations import CUDA_ANNOTATION, ENV_CUDA_VISIBLE_DEVICES, MAP_LABEL

#: The fieldRef the webhook wires CUDA_VISIBLE_DEVICES from.
CUDA_FIELD_PATH = f"metadata.annotations['{CUDA_ANNOTATION}']"


class ContainerEnv(Protocol):
    @property
    def list_name(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def env(self) -> tuple[Mapping[str, Any], ...]: ...


def _wired(env: Iterable[Mapping[str, Any]]) -> bool:
    for entry in env:
        if entry.get("name") != ENV_CUDA_VISIBLE_DEVICES:
            continue
        field = ((entry.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
        return field == CUDA_FIELD_PATH
    return False


def not_admitted(map_name: str, containers: Iterable[ContainerEnv]) -> str:
    """Why a pod labelled for map `map_name` was not admitted by the webhook ("" when it was):
    the first container without the webhook's CUDA_VISIBLE_DEVICES, or no container at all."""
    seen = False
    for container in containers:
        seen = True
        if not _wired(container.env):
            return (
                f"the pod has label {MAP_LABEL}={map_name} but was created without the gpuplace "
                f"webhook: {container.list_name} {container.name!r} has no "
                f"{ENV_CUDA_VISIBLE_DEVICES} from the binding (the label was added after create, "
                "or the webhook was not installed); gpuplace places a pod only as its webhook "
                "admitted it: delete the pod and create it again with the label"
            )
    if not seen:
        return f"the pod has label {MAP_LABEL}={map_name} but no containers"
    return ""
