"""The gang decision (placement/gang.py): all of a gang's slots bound at once, or none, under every
reason a slot waits; the timeout; a rank that restarts after the gang was bound; and ranks of
an Indexed Job taking their own slots whatever slot is free first."""

from __future__ import annotations

from dataclasses import replace

import pytest

from controller.slotcache import SlotCache
from placement.annotations import JOB_COMPLETION_INDEX
from placement.binding import Cluster, Code, NodeState, Placement, PodFacts, Status, plan
from placement.gang import Member, decide, gang_is_bound, unranked
from placement.indexing import resolve_index
from placement.maps import DeclaredSlot, Gang
from placement.model import CompiledMap
from placement.podmeta import identity_of
from placement.reasons import Reason
from placement.types import NodeName
from placement.wake import WakeKey
from tests.unit.placement.test_binding_plan import KEY, build

FOUR = [DeclaredSlot(i, f"gpu-{1 + i % 2}", (i // 2,)) for i in range(4)]
NODES = {f"gpu-{i}": NodeState(NodeName(f"gpu-{i}")) for i in (1, 2)}


def gang_cluster(timeout: int = 600, nodes: dict[str, NodeState] | None = None) -> Cluster:
    cluster = build(FOUR, nodes=nodes or NODES)
    cmap = cluster.model.maps[KEY]
    gang_map = replace(cmap, gang=Gang(timeout))
    model = replace(cluster.model, maps={KEY: gang_map})
    return replace(cluster, model=model)


def job_pod(rank: int, uid: str = "") -> PodFacts:
    return PodFacts(
        "ml",
        f"train-{rank}-x2x4z",
        uid or f"uid-{rank}",
        {JOB_COMPLETION_INDEX: str(rank)},
        "Job",
        "llm",
        None,
        True,
    )


def members(cluster: Cluster, cache: SlotCache, ranks: list[int]) -> list[Member]:
    return [Member(f"uid-{r}", r, plan(job_pod(r), cluster, cache)) for r in ranks]


def gmap(cluster: Cluster) -> CompiledMap:
    return cluster.model.maps[KEY]


def test_a_complete_servable_gang_binds_every_rank_at_once() -> None:
    cluster = gang_cluster()
    verdict = decide(gmap(cluster), members(cluster, SlotCache(), [3, 1, 0, 2]), 0.0)
    assert [uid for uid, _ in verdict.bind] == ["uid-0", "uid-1", "uid-2", "uid-3"]
    assert [p.slot.index for _, p in verdict.bind] == [0, 1, 2, 3]
    assert verdict.status is None


def test_a_missing_rank_binds_none() -> None:
    cluster = gang_cluster()
    verdict = decide(gmap(cluster), members(cluster, SlotCache(), [0, 1, 2]), 5.0)
    assert verdict.bind == ()
    assert verdict.status is not None
    assert verdict.status.reason is Reason.GANG_WAITING
    assert verdict.status.message == "map ml/llm gang: 3 of 4 ranks ready; slot 3 has no pod"
    assert WakeKey.map(KEY) in verdict.status.waits_for


def _blocked_slot_3(reason: Reason, message: str) -> Status:
    return Status(Code.UNSCHEDULABLE, reason, message, frozenset({WakeKey.node(NodeName("gpu-2"))}))


@pytest.mark.parametrize("reason", [r for r in Reason if not r.value.startswith("Gang")])
def test_one_waiting_rank_binds_none_whatever_it_waits_for(reason: Reason) -> None:
    cluster = gang_cluster()
    ready = members(cluster, SlotCache(), [0, 1, 2])
    waiting = Member("uid-3", 3, _blocked_slot_3(reason, "why"))
    verdict = decide(gmap(cluster), [*ready, waiting], 0.0)
    assert verdict.bind == ()
    assert verdict.status is not None
    assert verdict.status.message == (
        f"map ml/llm gang: 3 of 4 ranks ready; slot 3 waits {reason}: why"
    )
    assert WakeKey.node(NodeName("gpu-2")) in verdict.status.waits_for


def test_a_cordoned_node_keeps_the_whole_gang_waiting_then_frees_it() -> None:
    cordoned = dict(NODES, **{"gpu-2": NodeState(NodeName("gpu-2"), schedulable=False)})
    cluster = gang_cluster(nodes=cordoned)
    cache = SlotCache()
    verdict = decide(gmap(cluster), members(cluster, cache, [0, 1, 2, 3]), 0.0)
    assert verdict.bind == ()
    assert verdict.status is not None
    assert verdict.status.message.startswith(
        "map ml/llm gang: 2 of 4 ranks ready; slot 1 waits NodeCordoned"
    )
    assert gang_is_bound(gmap(cluster), cache) is False  # nothing assumed, no GPU held
    cluster = gang_cluster()
    verdict = decide(gmap(cluster), members(cluster, cache, [0, 1, 2, 3]), 0.0)
    assert len(verdict.bind) == 4


def test_past_its_timeout_a_gang_is_stuck_and_still_binds_none() -> None:
    cluster = gang_cluster(timeout=30)
    verdict = decide(gmap(cluster), members(cluster, SlotCache(), [0, 1, 2]), 31.0)
    assert verdict.bind == ()
    assert verdict.stuck
    assert verdict.status is not None and verdict.status.reason is Reason.GANG_STUCK
    assert "over its timeoutSeconds 30" in verdict.status.message
    early = decide(gmap(cluster), members(cluster, SlotCache(), [0, 1, 2]), 29.0)
    assert not early.stuck


def test_two_pods_of_one_rank_give_the_slot_to_the_first() -> None:
    cluster = gang_cluster()
    ms = members(cluster, SlotCache(), [0, 1, 2, 3])
    second = Member("uid-3b", 3, plan(job_pod(3, "uid-3b"), cluster, SlotCache()))
    verdict = decide(gmap(cluster), [*ms, second], 0.0)
    assert ("uid-3b" not in [uid for uid, _ in verdict.bind]) and len(verdict.bind) == 4


def test_a_rank_that_restarts_after_the_gang_was_bound_takes_its_slot_alone() -> None:
    cluster = gang_cluster()
    cache = SlotCache()
    verdict = decide(gmap(cluster), members(cluster, cache, [0, 1, 2, 3]), 0.0)
    for uid, placement in verdict.bind:
        cache.assume(uid, f"ml/{uid}", placement)
    assert gang_is_bound(gmap(cluster), cache)
    cache.release("uid-2")  # rank 2's pod failed and is gone
    assert gang_is_bound(gmap(cluster), cache)  # the others stay bound: it goes alone
    again = plan(job_pod(2, "uid-2-new"), cluster, cache)
    assert isinstance(again, Placement) and again.slot.index == 2


def test_an_unranked_pod_of_a_gang_map_is_refused_with_why() -> None:
    status = unranked(gmap(gang_cluster()))
    assert status.reason is Reason.GANG_UNRANKED and status.code is Code.UNRESOLVABLE


def test_indexed_job_ranks_never_take_a_free_lower_slot() -> None:
    """The ranks of an Indexed Job, created in any order while the node of slots 1 and 3 is
    cordoned: ranks 0 and 2 take their own slots; 1 and 3 wait for theirs, never slot 0 or 2."""
    cordoned = dict(NODES, **{"gpu-2": NodeState(NodeName("gpu-2"), schedulable=False)})
    cluster = build(FOUR, nodes=cordoned)
    cache = SlotCache()
    for rank in (3, 1, 2, 0):
        result = plan(job_pod(rank), cluster, cache)
        if rank % 2:
            assert isinstance(result, Status) and result.reason is Reason.NODE_CORDONED
        else:
            assert isinstance(result, Placement) and result.slot.index == rank
            cache.assume(f"uid-{rank}", f"ml/train-{rank}", result)
    cache.release("uid-2")  # rank 2 restarts while slot 2 is the only free servable one
    result = plan(job_pod(1, "uid-1"), cluster, cache)
    assert isinstance(result, Status) and result.reason is Reason.NODE_CORDONED


def test_a_rank_with_no_slot_waits_naming_the_rank_and_the_map() -> None:
    result = plan(job_pod(7), build(FOUR, nodes=NODES), SlotCache())
    assert isinstance(result, Status) and result.reason is Reason.INDEX_NOT_IN_MAP
    assert result.message == "map ml/llm has no index 7 (job)"


def test_the_webhooks_reading_of_a_job_pod_is_the_binders() -> None:
    class View:
        name, labels, annotations = "train-0-x", {}, {JOB_COMPLETION_INDEX: "2"}
        owner_kind, generated = "Job", True

    assert resolve_index(identity_of(View()), gmap(gang_cluster()).indexing).index == 2
