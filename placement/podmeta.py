"""What gpuplace reads in a pod's labels and annotations: the map it asks for, its own
gpu-scheduling-map line (the earlier tools'), and whom its index is chosen by.

Pure readings of a pod view (`kubeio.pod.Pod`, or anything shaped like it), so that the Kubernetes
plumbing knows no gpuplace key and every component reads a pod's gpuplace fields the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from placement.annotations import LEGACY_ANNOTATION, MAP_LABEL, has_binding_annotations
from placement.errors import PlacementError
from placement.indexing import RANK_ANNOTATIONS, PodIdentity
from placement.legacy import PodLine, pod_line


class PodMeta(Protocol):
    """The metadata of a pod that these readings need; `str(pod)` names it (namespace/name)."""

    @property
    def name(self) -> str: ...
    @property
    def labels(self) -> Mapping[str, str]: ...
    @property
    def annotations(self) -> Mapping[str, str]: ...
    @property
    def owner_kind(self) -> str | None: ...
    @property
    def generated(self) -> bool: ...


def map_name_of(pod: PodMeta) -> str | None:
    """Label gpuplace.io/map: the placement map the pod asks for."""
    return pod.labels.get(MAP_LABEL)


def legacy_text_of(pod: PodMeta) -> str | None:
    """Annotation gpu-scheduling-map: the earlier tools' map, carried by the pod itself."""
    return pod.annotations.get(LEGACY_ANNOTATION)


def has_binding(pod: PodMeta) -> bool:
    """Whether any gpuplace.io/* binding annotation is on the pod."""
    return has_binding_annotations(pod.annotations)


def identity_of(pod: PodMeta) -> PodIdentity:
    """What a map's `indexing` reads to choose the pod's index."""
    return PodIdentity(
        pod.name, pod.labels, pod.owner_kind, pod.generated, rank_annotations_of(pod)
    )


def rank_annotations_of(pod: PodMeta) -> Mapping[str, str]:
    """The few annotations rank resolution reads (an Indexed Job's completion index on older
    clusters, a LeaderWorkerSet's group size): all a decision needs to keep of them."""
    return {k: pod.annotations[k] for k in RANK_ANNOTATIONS if k in pod.annotations}


def legacy_line(pod: PodMeta) -> PodLine:
    """The pod's own gpu-scheduling-map text, parsed for this pod (its name's ordinal picks
    the line). Raises PlacementError, located in the annotation, when the text is broken."""
    return pod_line(
        legacy_text_of(pod) or "", pod.name, f"pod {pod} annotation {LEGACY_ANNOTATION}"
    )


def prebound_line(pod: PodMeta) -> PodLine | None:
    """For a pod the earlier tools placed (its own gpu-scheduling-map text, no gpuplace
    binding): that text read for it, when it has a line for the pod's index; else None
    (broken text included: such a pod holds nothing by it)."""
    if legacy_text_of(pod) is None or has_binding(pod):
        return None
    try:
        line = legacy_line(pod)
    except PlacementError:
        return None
    return line if line.index is not None and line.entry is not None else None
