"""Which slot a pod asks for: label, StatefulSet ordinal, name suffix, or the lowest free slot."""

from __future__ import annotations

import pytest

from placement.annotations import INDEX_LABEL, STATEFULSET_INDEX_LABEL, legacy_map_key, name_ordinal
from placement.indexing import IndexChoice, IndexSource, PodIdentity, lowest_free, resolve_index
from placement.types import Indexing, MapKey


def pod(name: str = "web-3", owner: str | None = None, **labels: str) -> PodIdentity:
    return PodIdentity(name, labels, owner)


STS = "StatefulSet"


@pytest.mark.parametrize(
    ("identity", "indexing", "expected"),
    [
        # An explicit label wins, except where the map allocates.
        (pod(**{INDEX_LABEL: "7"}), Indexing.AUTO, IndexChoice(7, IndexSource.LABEL)),
        (pod(owner=STS, **{INDEX_LABEL: "7"}), Indexing.ORDINAL, IndexChoice(7, IndexSource.LABEL)),
        (pod(**{INDEX_LABEL: "7"}), Indexing.LABEL, IndexChoice(7, IndexSource.LABEL)),
        (pod(**{INDEX_LABEL: "7"}), Indexing.ALLOCATE, IndexChoice(None, IndexSource.ALLOCATE)),
        # StatefulSet ordinal: the pod-index label first, then the name.
        (
            pod("web-3", STS, **{STATEFULSET_INDEX_LABEL: "5"}),
            Indexing.AUTO,
            IndexChoice(5, IndexSource.ORDINAL),
        ),
        (pod("web-3", STS), Indexing.AUTO, IndexChoice(3, IndexSource.NAME)),
        (pod("web-3", None), Indexing.ORDINAL, IndexChoice(3, IndexSource.NAME)),
        # A pod without a controller whose name says its index takes it, whatever the order of
        # creation (the migration of the earlier tools' bare pods webhook-test-0..2).
        (pod("webhook-test-2", None), Indexing.AUTO, IndexChoice(2, IndexSource.NAME)),
        (pod("webhook-test-0", None), Indexing.AUTO, IndexChoice(0, IndexSource.NAME)),
        (pod("trainer", None), Indexing.AUTO, IndexChoice(None, IndexSource.ALLOCATE)),
        # ... but a generated name (metadata.generateName) says nothing.
        (
            PodIdentity("web-24567", {}, None, generated=True),
            Indexing.AUTO,
            IndexChoice(None, IndexSource.ALLOCATE),
        ),
        (pod("webhook-test-2", None), Indexing.ALLOCATE, IndexChoice(None, IndexSource.ALLOCATE)),
        # Deployments and Jobs: no ordinal, allocate.
        (pod("train-3", "Job"), Indexing.AUTO, IndexChoice(None, IndexSource.ALLOCATE)),
        (
            pod("web-7f9c-x2x4z", "ReplicaSet"),
            Indexing.AUTO,
            IndexChoice(None, IndexSource.ALLOCATE),
        ),
        (pod("web-3", "ReplicaSet"), Indexing.AUTO, IndexChoice(None, IndexSource.ALLOCATE)),
        (pod("web-3", STS), Indexing.ALLOCATE, IndexChoice(None, IndexSource.ALLOCATE)),
    ],
)
def test_resolve_index(identity: PodIdentity, indexing: Indexing, expected: IndexChoice) -> None:
    assert resolve_index(identity, indexing) == expected


@pytest.mark.parametrize(
    ("identity", "indexing", "error"),
    [
        (
            pod(**{INDEX_LABEL: "-1"}),
            Indexing.AUTO,
            "label gpuplace.io/index '-1' is not an index between 0 and 99999",
        ),
        (
            pod(**{INDEX_LABEL: "100000"}),
            Indexing.LABEL,
            "label gpuplace.io/index '100000' is not an index between 0 and 99999",
        ),
        (
            pod(**{INDEX_LABEL: "٣"}),
            Indexing.AUTO,
            "label gpuplace.io/index '٣' is not an index between 0 and 99999",
        ),
        (
            pod(),
            Indexing.LABEL,
            "map uses 'indexing: label' but the pod has no gpuplace.io/index label",
        ),
        (
            pod("web", None),
            Indexing.ORDINAL,
            "map uses 'indexing: ordinal' but pod name 'web' has no '-<n>' suffix",
        ),
        (
            pod(owner=STS, **{STATEFULSET_INDEX_LABEL: "x"}),
            Indexing.AUTO,
            "label apps.kubernetes.io/pod-index 'x' is not an index between 0 and 99999",
        ),
    ],
)
def test_unusable_indices_are_errors(identity: PodIdentity, indexing: Indexing, error: str) -> None:
    choice = resolve_index(identity, indexing)
    assert (choice.index, choice.error) == (None, error)


def test_lowest_free_skips_taken_and_undeclared_indices() -> None:
    assert lowest_free([0, 1, 2, 5], {0: "uid-a", 1: "uid-b"}) == 2
    assert lowest_free([1, 5], set()) == 1
    assert lowest_free([0, 1], {0, 1}) is None


@pytest.mark.parametrize(
    ("name", "ordinal"),
    [
        ("webhook-test-0", 0),
        ("webhook-test-12", 12),
        ("web", None),
        ("web-", None),
        ("web-1a", None),
    ],
)
def test_name_ordinal(name: str, ordinal: int | None) -> None:
    assert name_ordinal(name) == ordinal


def test_legacy_pods_of_one_statefulset_share_a_slot_namespace() -> None:
    assert legacy_map_key("default", "webhook-test-2") == MapKey("default", "legacy.webhook-test")
    assert legacy_map_key("default", "webhook-test-0") == legacy_map_key(
        "default", "webhook-test-1"
    )
