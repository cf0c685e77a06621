"""gpuplace's CustomResourceDefinitions on a local cluster, as the chart's crds/ holds them
(`placement.crd` is the source of both), so that every test can apply PlacementMaps."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from kubeio.paths import CUSTOM_RESOURCE_DEFINITIONS
from placement.crd import all_crds

#: `LocalCluster.request`: (method, path, body) -> (status, decoded body).
Request = Callable[..., tuple[int, Any]]


class CrdError(RuntimeError):
    """The apiserver refused a CRD."""


def create(request: Request) -> list[str]:
    """Creates the CRDs (one that exists is left as it is); returns their names."""
    names = []
    for crd in all_crds():
        name = crd["metadata"]["name"]
        status, body = request("POST", CUSTOM_RESOURCE_DEFINITIONS.collection(), crd)
        if status not in (201, 409):
            message = body.get("message") if isinstance(body, dict) else body
            raise CrdError(f"creating CRD {name}: HTTP {status}: {message}")
        names.append(name)
    return names


def established(request: Request, names: Iterable[str]) -> bool:
    """Whether the apiserver serves every CRD of `names` (condition Established)."""
    for name in names:
        status, body = request("GET", CUSTOM_RESOURCE_DEFINITIONS.item(name))
        if status != 200:
            return False
        conditions = (body.get("status") or {}).get("conditions") or ()
        if not any(
            c.get("type") == "Established" and c.get("status") == "True" for c in conditions
        ):
            return False
    return True
