"""Which slot index a pod asks for, in this order of precedence:

1. label `gpuplace.io/index` (not under `indexing: allocate`);
2. label `apps.kubernetes.io/pod-index` (what the StatefulSet controller sets);
3. the name's `-<n>` suffix, for pods a StatefulSet owns and for pods without a controller whose
   name was written, not generated (`webhook-test-2`): such a name says its index, so the slot
   never depends on the order in which pods are created;
4. otherwise (Deployments, Jobs, generated names) the lowest free slot.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from placement.annotations import INDEX_LABEL, STATEFULSET_INDEX_LABEL, name_ordinal
from placement.types import MAX_INDEX, Indexing


class IndexSource(StrEnum):
    LABEL = "label"
    ORDINAL = "ordinal"
    NAME = "name"
    ALLOCATE = "allocate"


@dataclass(frozen=True, slots=True)
class PodIdentity:
    """What index resolution needs to know about a pod."""

    name: str
    labels: Mapping[str, str]
    owner_kind: str | None = None  # kind of the controller in ownerReferences, if any
    generated: bool = False  # the name came from metadata.generateName

    @property
    def named_by_hand(self) -> bool:
        """A pod without a controller whose name someone chose: its suffix is deliberate."""
        return self.owner_kind is None and not self.generated


@dataclass(frozen=True, slots=True)
class IndexChoice:
    """An explicit index, a request to allocate (index None, no error), or an error."""

    index: int | None
    source: IndexSource
    error: str = ""


def _labelled(pod: PodIdentity, label: str, source: IndexSource) -> IndexChoice:
    """The index the pod's `label` holds, or why it is not one."""
    value = pod.labels[label]
    if not (value.isdecimal() and value.isascii()) or int(value) > MAX_INDEX:
        return IndexChoice(
            None, source, f"label {label} {value!r} is not an index between 0 and {MAX_INDEX}"
        )
    return IndexChoice(int(value), source)


def resolve_index(pod: PodIdentity, indexing: Indexing) -> IndexChoice:
    if indexing is not Indexing.ALLOCATE and INDEX_LABEL in pod.labels:
        return _labelled(pod, INDEX_LABEL, IndexSource.LABEL)
    if indexing is Indexing.LABEL:
        return IndexChoice(
            None,
            IndexSource.LABEL,
            f"map uses 'indexing: label' but the pod has no {INDEX_LABEL} label",
        )
    if indexing in (Indexing.AUTO, Indexing.ORDINAL):
        if STATEFULSET_INDEX_LABEL in pod.labels:
            return _labelled(pod, STATEFULSET_INDEX_LABEL, IndexSource.ORDINAL)
        if pod.owner_kind == "StatefulSet" or pod.named_by_hand or indexing is Indexing.ORDINAL:
            ordinal = name_ordinal(pod.name)
            if ordinal is not None and ordinal <= MAX_INDEX:
                return IndexChoice(ordinal, IndexSource.NAME)
            if indexing is Indexing.ORDINAL:
                return IndexChoice(
                    None,
                    IndexSource.NAME,
                    f"map uses 'indexing: ordinal' but pod name {pod.name!r} has no '-<n>' suffix",
                )
    return IndexChoice(None, IndexSource.ALLOCATE)


def lowest_free(indices: Iterable[int], taken: Mapping[int, object] | set[int]) -> int | None:
    """The lowest declared index not taken; `indices` is sorted ascending."""
    for index in indices:
        if index not in taken:
            return index
    return None
