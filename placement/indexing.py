"""Which slot index (the pod's rank) a pod asks for, in this order of precedence:

1. label `gpuplace.io/index` (not under `indexing: allocate`);
2. the label the map names in `indexLabel`, for any other controller that writes a rank;
3. LeaderWorkerSet: group * size + worker (labels `leaderworkerset.sigs.k8s.io/group-index` and
   `worker-index`, annotation `leaderworkerset.sigs.k8s.io/size`). One map serves the whole
   LeaderWorkerSet: its groups share one pod template, so they can only name one map, and its
   pods are owned by StatefulSets, so this comes before the StatefulSet ordinal (which would
   give every group's leader slot 0.. and every group's worker the same slot);
4. JobSet: job global index * `podsPerJob` + completion index (labels
   `jobset.sigs.k8s.io/job-global-index` and `batch.kubernetes.io/job-completion-index`).
   JobSet writes no pod count per Job on its pods, so the map says it (`podsPerJob`, the
   replicated Jobs' parallelism; 1 when absent, and then a completion index above 0 is an
   error, never a guess). JobSet's pods are Job pods, so this comes before the Job's own index;
5. Indexed Job: `batch.kubernetes.io/job-completion-index` (label, or annotation on clusters
   older than the label), on pods a Job owns;
6. Kueue pod groups: label `kueue.x-k8s.io/pod-group-pod-index`;
7. StatefulSet: label `apps.kubernetes.io/pod-index`;
8. the name's `-<n>` suffix, for pods a StatefulSet owns and for pods without a controller whose
   name was written, not generated (`webhook-test-2`): such a name says its index, so the slot
   never depends on the order in which pods are created;
9. otherwise (Deployments, generated names) the lowest free slot.

Sources 2-8 are ranks: a pod that has one takes that slot or waits for it, never another
(`IndexChoice.ranked`). Workload ranks (3-6) apply under `indexing: auto` and `ordinal`; the
map's `indexLabel` under `auto` and `label`. A rank that is present but unusable is an error
that names the label, never a fall back to the lowest free slot.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType

from placement.annotations import (
    INDEX_LABEL,
    JOB_COMPLETION_INDEX,
    JOBSET_GLOBAL_INDEX_LABEL,
    JOBSET_NAME_LABEL,
    KUEUE_POD_GROUP_INDEX_LABEL,
    LWS_GROUP_INDEX_LABEL,
    LWS_SIZE_ANNOTATION,
    LWS_WORKER_INDEX_LABEL,
    STATEFULSET_INDEX_LABEL,
    name_ordinal,
)
from placement.types import MAX_INDEX, Indexing

#: The annotations rank resolution reads: all a reader of pods needs to keep of them for it.
RANK_ANNOTATIONS = (JOB_COMPLETION_INDEX, LWS_SIZE_ANNOTATION)

_NONE: Mapping[str, str] = MappingProxyType({})


class IndexSource(StrEnum):
    LABEL = "label"
    INDEX_LABEL = "indexLabel"
    LEADER_WORKER_SET = "leaderworkerset"
    JOBSET = "jobset"
    JOB = "job"
    KUEUE = "kueue"
    ORDINAL = "ordinal"
    NAME = "name"
    ALLOCATE = "allocate"


@dataclass(frozen=True, slots=True)
class RankRules:
    """What a map says about its pods' ranks beyond `indexing` (spec.indexLabel, spec.podsPerJob)."""

    index_label: str = ""
    pods_per_job: int = 0  # 0: not declared (one pod per Job)


@dataclass(frozen=True, slots=True)
class PodIdentity:
    """What index resolution needs to know about a pod."""

    name: str
    labels: Mapping[str, str]
    owner_kind: str | None = None  # kind of the controller in ownerReferences, if any
    generated: bool = False  # the name came from metadata.generateName
    #: Only the `RANK_ANNOTATIONS` matter.
    annotations: Mapping[str, str] = field(default_factory=lambda: _NONE)

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

    @property
    def ranked(self) -> bool:
        """The pod has a rank of its own: it takes that slot or waits, never another."""
        return self.source is not IndexSource.ALLOCATE


def _number(value: str) -> int | None:
    if not (value.isdecimal() and value.isascii()) or int(value) > MAX_INDEX:
        return None
    return int(value)


def _not_index(what: str, value: str) -> str:
    return f"{what} {value!r} is not an index between 0 and {MAX_INDEX}"


def _labelled(pod: PodIdentity, label: str, source: IndexSource) -> IndexChoice:
    """The index the pod's `label` holds, or why it is not one."""
    value = pod.labels[label]
    number = _number(value)
    if number is None:
        return IndexChoice(None, source, _not_index(f"label {label}", value))
    return IndexChoice(number, source)


def _rank(number: int, source: IndexSource, how: str) -> IndexChoice:
    if number > MAX_INDEX:
        return IndexChoice(None, source, f"rank {number} ({how}) is over {MAX_INDEX}")
    return IndexChoice(number, source)


def _leader_worker_set(pod: PodIdentity) -> IndexChoice:
    source = IndexSource.LEADER_WORKER_SET
    group_text = pod.labels[LWS_GROUP_INDEX_LABEL]
    worker_text = pod.labels.get(LWS_WORKER_INDEX_LABEL, "0")
    size_text = pod.annotations.get(LWS_SIZE_ANNOTATION)
    group, worker = _number(group_text), _number(worker_text)
    if group is None:
        return IndexChoice(None, source, _not_index(f"label {LWS_GROUP_INDEX_LABEL}", group_text))
    if worker is None:
        return IndexChoice(None, source, _not_index(f"label {LWS_WORKER_INDEX_LABEL}", worker_text))
    if size_text is None:
        return IndexChoice(
            None,
            source,
            f"label {LWS_GROUP_INDEX_LABEL} is set but annotation {LWS_SIZE_ANNOTATION} (the "
            "group's size, which LeaderWorkerSet writes) is not: the rank group * size + worker "
            "cannot be computed",
        )
    size = _number(size_text)
    if size is None or size == 0:
        return IndexChoice(
            None, source, f"annotation {LWS_SIZE_ANNOTATION} {size_text!r} is not a group size"
        )
    if worker >= size:
        return IndexChoice(
            None, source, f"worker index {worker} is not below the group size {size}"
        )
    return _rank(group * size + worker, source, f"group {group} * size {size} + worker {worker}")


def _completion_index(pod: PodIdentity) -> str | None:
    """The Indexed Job's completion index: the label, else the annotation (clusters from before
    the label), on a pod a Job owns."""
    if pod.owner_kind != "Job":
        return None
    return pod.labels.get(JOB_COMPLETION_INDEX, pod.annotations.get(JOB_COMPLETION_INDEX))


def _jobset(pod: PodIdentity, rules: RankRules) -> IndexChoice:
    source = IndexSource.JOBSET
    global_text = pod.labels[JOBSET_GLOBAL_INDEX_LABEL]
    job = _number(global_text)
    if job is None:
        return IndexChoice(
            None, source, _not_index(f"label {JOBSET_GLOBAL_INDEX_LABEL}", global_text)
        )
    completion_text = _completion_index(pod) or "0"
    completion = _number(completion_text)
    if completion is None:
        return IndexChoice(None, source, _not_index(f"{JOB_COMPLETION_INDEX}", completion_text))
    per_job = rules.pods_per_job or 1
    if completion >= per_job:
        declared = (
            f"its spec.podsPerJob is {rules.pods_per_job}"
            if rules.pods_per_job
            else "it declares no spec.podsPerJob (one pod per Job)"
        )
        return IndexChoice(
            None,
            source,
            f"JobSet pod has completion index {completion} but {declared}: set spec.podsPerJob "
            "to the replicated Jobs' parallelism",
        )
    return _rank(
        job * per_job + completion,
        source,
        f"job {job} * {per_job} pods per job + completion index {completion}",
    )


def _workload_rank(pod: PodIdentity, rules: RankRules) -> IndexChoice | None:
    """The rank the pod's workload controller wrote (sources 3-6), if any."""
    if LWS_GROUP_INDEX_LABEL in pod.labels:
        return _leader_worker_set(pod)
    if JOBSET_GLOBAL_INDEX_LABEL in pod.labels:
        return _jobset(pod, rules)
    if JOBSET_NAME_LABEL in pod.labels:
        return IndexChoice(
            None,
            IndexSource.JOBSET,
            f"JobSet pod without label {JOBSET_GLOBAL_INDEX_LABEL} (a JobSet release that does "
            "not write it): set the map's spec.indexLabel to a label that carries the rank",
        )
    completion = _completion_index(pod)
    if completion is not None:
        number = _number(completion)
        if number is None:
            return IndexChoice(None, IndexSource.JOB, _not_index(JOB_COMPLETION_INDEX, completion))
        return IndexChoice(number, IndexSource.JOB)
    if KUEUE_POD_GROUP_INDEX_LABEL in pod.labels:
        return _labelled(pod, KUEUE_POD_GROUP_INDEX_LABEL, IndexSource.KUEUE)
    return None


def resolve_index(
    pod: PodIdentity, indexing: Indexing, rules: RankRules = RankRules()
) -> IndexChoice:
    if indexing is Indexing.ALLOCATE:
        return IndexChoice(None, IndexSource.ALLOCATE)
    if INDEX_LABEL in pod.labels:
        return _labelled(pod, INDEX_LABEL, IndexSource.LABEL)
    if indexing in (Indexing.AUTO, Indexing.LABEL) and rules.index_label in pod.labels:
        return _labelled(pod, rules.index_label, IndexSource.INDEX_LABEL)
    if indexing is Indexing.LABEL:
        also = f" or its indexLabel {rules.index_label}" if rules.index_label else ""
        return IndexChoice(
            None,
            IndexSource.LABEL,
            f"map uses 'indexing: label' but the pod has no {INDEX_LABEL} label{also}",
        )
    workload = _workload_rank(pod, rules)
    if workload is not None:
        return workload
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


def describe_source(choice: IndexChoice, rules: RankRules = RankRules()) -> str:
    """Where a rank came from, as people read it (admission messages, explain)."""
    return {
        IndexSource.LABEL: f"label {INDEX_LABEL}",
        IndexSource.INDEX_LABEL: f"the map's indexLabel {rules.index_label}",
        IndexSource.LEADER_WORKER_SET: "LeaderWorkerSet group * size + worker",
        IndexSource.JOBSET: "JobSet job global index * podsPerJob + completion index",
        IndexSource.JOB: f"Indexed Job {JOB_COMPLETION_INDEX}",
        IndexSource.KUEUE: f"Kueue label {KUEUE_POD_GROUP_INDEX_LABEL}",
        IndexSource.ORDINAL: f"label {STATEFULSET_INDEX_LABEL}",
        IndexSource.NAME: "the pod name's ordinal suffix",
        IndexSource.ALLOCATE: "allocation",
    }[choice.source]


def lowest_free(indices: Iterable[int], taken: Mapping[int, object] | set[int]) -> int | None:
    """The lowest declared index not taken; `indices` is sorted ascending."""
    for index in indices:
        if index not in taken:
            return index
    return None
