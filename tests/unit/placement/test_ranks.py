"""Ranks that training workloads' controllers write: Indexed Job, JobSet, LeaderWorkerSet,
Kueue pod groups and a map's indexLabel, with their precedence (placement/indexing.py)."""

from __future__ import annotations

import pytest

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
)
from placement.indexing import (
    IndexChoice,
    IndexSource,
    PodIdentity,
    RankRules,
    describe_source,
    resolve_index,
)
from placement.types import Indexing


class PodBuilder:
    """make_pod("train-0-x2x4z").owner("Job").label(...).obj()"""

    def __init__(self, name: str) -> None:
        self.name = name
        self.labels: dict[str, str] = {}
        self.annotations: dict[str, str] = {}
        self.kind: str | None = None
        self.generated = False

    def owner(self, kind: str) -> PodBuilder:
        self.kind, self.generated = kind, True
        return self

    def label(self, key: str, value: str) -> PodBuilder:
        self.labels[key] = value
        return self

    def annotation(self, key: str, value: str) -> PodBuilder:
        self.annotations[key] = value
        return self

    def obj(self) -> PodIdentity:
        return PodIdentity(self.name, self.labels, self.kind, self.generated, self.annotations)


def make_pod(name: str = "train-x2x4z") -> PodBuilder:
    return PodBuilder(name)


def job_pod(index: int) -> PodBuilder:
    return make_pod(f"train-{index}-abcde").owner("Job").label(JOB_COMPLETION_INDEX, str(index))


def jobset_pod(job: int, completion: int) -> PodBuilder:
    return (
        job_pod(completion)
        .label(JOBSET_NAME_LABEL, "llm")
        .label(JOBSET_GLOBAL_INDEX_LABEL, str(job))
    )


def lws_pod(group: int, worker: int, size: int | None, owner: str = "StatefulSet") -> PodBuilder:
    built = (
        make_pod(f"lws-{group}-{worker}")
        .owner(owner)
        .label(LWS_GROUP_INDEX_LABEL, str(group))
        .label(LWS_WORKER_INDEX_LABEL, str(worker))
        .label(STATEFULSET_INDEX_LABEL, str(worker))
    )
    return built.annotation(LWS_SIZE_ANNOTATION, str(size)) if size is not None else built


AUTO = Indexing.AUTO


@pytest.mark.parametrize(
    ("pod", "indexing", "rules", "expected"),
    [
        # Indexed Job: the label, or the annotation on clusters older than the label.
        (job_pod(2).obj(), AUTO, RankRules(), IndexChoice(2, IndexSource.JOB)),
        (job_pod(2).obj(), Indexing.ORDINAL, RankRules(), IndexChoice(2, IndexSource.JOB)),
        (
            make_pod().owner("Job").annotation(JOB_COMPLETION_INDEX, "3").obj(),
            AUTO,
            RankRules(),
            IndexChoice(3, IndexSource.JOB),
        ),
        # ... only on a pod a Job owns: a hand-made pod's copy of the label is not a rank.
        (
            make_pod().owner("ReplicaSet").label(JOB_COMPLETION_INDEX, "3").obj(),
            AUTO,
            RankRules(),
            IndexChoice(None, IndexSource.ALLOCATE),
        ),
        # JobSet: job global index * podsPerJob + completion index.
        (jobset_pod(0, 0).obj(), AUTO, RankRules(), IndexChoice(0, IndexSource.JOBSET)),
        (jobset_pod(3, 0).obj(), AUTO, RankRules(), IndexChoice(3, IndexSource.JOBSET)),
        (
            jobset_pod(2, 1).obj(),
            AUTO,
            RankRules(pods_per_job=4),
            IndexChoice(9, IndexSource.JOBSET),
        ),
        # LeaderWorkerSet: group * size + worker, before the StatefulSet ordinal its pods carry.
        (lws_pod(0, 0, 4).obj(), AUTO, RankRules(), IndexChoice(0, IndexSource.LEADER_WORKER_SET)),
        (lws_pod(2, 3, 4).obj(), AUTO, RankRules(), IndexChoice(11, IndexSource.LEADER_WORKER_SET)),
        (
            lws_pod(1, 0, 4).label(STATEFULSET_INDEX_LABEL, "1").obj(),
            AUTO,
            RankRules(),
            IndexChoice(4, IndexSource.LEADER_WORKER_SET),
        ),
        # Kueue pod groups.
        (
            make_pod("p-1").label(KUEUE_POD_GROUP_INDEX_LABEL, "5").obj(),
            AUTO,
            RankRules(),
            IndexChoice(5, IndexSource.KUEUE),
        ),
        # A map's indexLabel, under auto and label, ahead of every workload rank.
        (
            job_pod(2).label("example.com/rank", "7").obj(),
            AUTO,
            RankRules(index_label="example.com/rank"),
            IndexChoice(7, IndexSource.INDEX_LABEL),
        ),
        (
            make_pod().label("example.com/rank", "7").obj(),
            Indexing.LABEL,
            RankRules(index_label="example.com/rank"),
            IndexChoice(7, IndexSource.INDEX_LABEL),
        ),
        # ... not under ordinal (the workload's rank then).
        (
            job_pod(2).label("example.com/rank", "7").obj(),
            Indexing.ORDINAL,
            RankRules(index_label="example.com/rank"),
            IndexChoice(2, IndexSource.JOB),
        ),
        # gpuplace.io/index beats every other source.
        (
            jobset_pod(3, 0).label(INDEX_LABEL, "1").obj(),
            AUTO,
            RankRules(index_label="example.com/rank"),
            IndexChoice(1, IndexSource.LABEL),
        ),
        # Under allocate nothing is a rank.
        (job_pod(2).obj(), Indexing.ALLOCATE, RankRules(), IndexChoice(None, IndexSource.ALLOCATE)),
        (
            lws_pod(2, 3, 4).obj(),
            Indexing.ALLOCATE,
            RankRules(),
            IndexChoice(None, IndexSource.ALLOCATE),
        ),
        # Under label only the labels count.
        (
            job_pod(2).obj(),
            Indexing.LABEL,
            RankRules(),
            IndexChoice(
                None,
                IndexSource.LABEL,
                "map uses 'indexing: label' but the pod has no gpuplace.io/index label",
            ),
        ),
    ],
)
def test_ranks_and_their_precedence(
    pod: PodIdentity, indexing: Indexing, rules: RankRules, expected: IndexChoice
) -> None:
    assert resolve_index(pod, indexing, rules) == expected


@pytest.mark.parametrize(
    ("pod", "rules", "error"),
    [
        (
            job_pod(0).label(JOB_COMPLETION_INDEX, "x").obj(),
            RankRules(),
            "batch.kubernetes.io/job-completion-index 'x' is not an index between 0 and 99999",
        ),
        (
            jobset_pod(1, 2).obj(),
            RankRules(),
            "JobSet pod has completion index 2 but it declares no spec.podsPerJob (one pod per "
            "Job): set spec.podsPerJob to the replicated Jobs' parallelism",
        ),
        (
            jobset_pod(1, 4).obj(),
            RankRules(pods_per_job=4),
            "JobSet pod has completion index 4 but its spec.podsPerJob is 4: set spec.podsPerJob "
            "to the replicated Jobs' parallelism",
        ),
        (
            job_pod(0).label(JOBSET_NAME_LABEL, "llm").obj(),
            RankRules(),
            "JobSet pod without label jobset.sigs.k8s.io/job-global-index (a JobSet release that "
            "does not write it): set the map's spec.indexLabel to a label that carries the rank",
        ),
        (
            jobset_pod(99_999, 1).obj(),
            RankRules(pods_per_job=2),
            "rank 199999 (job 99999 * 2 pods per job + completion index 1) is over 99999",
        ),
        (
            lws_pod(1, 1, None).obj(),
            RankRules(),
            "label leaderworkerset.sigs.k8s.io/group-index is set but annotation "
            "leaderworkerset.sigs.k8s.io/size (the group's size, which LeaderWorkerSet writes) "
            "is not: the rank group * size + worker cannot be computed",
        ),
        (
            lws_pod(1, 4, 4).obj(),
            RankRules(),
            "worker index 4 is not below the group size 4",
        ),
        (
            lws_pod(1, 0, 0).obj(),
            RankRules(),
            "annotation leaderworkerset.sigs.k8s.io/size '0' is not a group size",
        ),
        (
            lws_pod(1, 0, 4).label(LWS_GROUP_INDEX_LABEL, "a").obj(),
            RankRules(),
            "label leaderworkerset.sigs.k8s.io/group-index 'a' is not an index between 0 and 99999",
        ),
        (
            make_pod().label(KUEUE_POD_GROUP_INDEX_LABEL, "-2").obj(),
            RankRules(),
            "label kueue.x-k8s.io/pod-group-pod-index '-2' is not an index between 0 and 99999",
        ),
        (
            make_pod().label("example.com/rank", "one").obj(),
            RankRules(index_label="example.com/rank"),
            "label example.com/rank 'one' is not an index between 0 and 99999",
        ),
    ],
)
def test_a_rank_that_cannot_be_used_is_an_error_never_an_allocation(
    pod: PodIdentity, rules: RankRules, error: str
) -> None:
    choice = resolve_index(pod, AUTO, rules)
    assert (choice.index, choice.error) == (None, error)
    assert choice.ranked


def test_only_unranked_pods_allocate() -> None:
    assert not resolve_index(make_pod().owner("ReplicaSet").obj(), AUTO).ranked
    assert resolve_index(job_pod(0).obj(), AUTO).ranked


def test_every_source_is_described() -> None:
    for source in IndexSource:
        assert describe_source(IndexChoice(0, source), RankRules("example.com/rank"))
