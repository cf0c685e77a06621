"""A gang's standing in its map's status (placement/gang.py `GangVerdict.standing`,
placement/status.py `GangStatus`): the line people read, the annotation's and the custom
resource's fields, and the GangStuck condition."""

from __future__ import annotations

from controller.slotcache import SlotCache
from placement.binding import NodeState
from placement.gang import decide
from placement.resourcestatus import conditions, resource_status, status_from_resource
from placement.status import GangStatus, MapStatus, Phase
from placement.types import NodeName
from tests.unit.placement.test_gang import NODES, gang_cluster, gmap, members

WAITING = GangStatus(4, 3, ((3, "DeviceBusy"),), timeout_seconds=600)


def test_a_waiting_gang_reads_as_its_ready_ranks_and_the_slots_it_waits_for() -> None:
    nodes = dict(NODES)
    nodes["gpu-2"] = NodeState(NodeName("gpu-2"), schedulable=False)  # slots 1 and 3
    cluster = gang_cluster(nodes=nodes)
    verdict = decide(gmap(cluster), members(cluster, SlotCache(), [0, 1, 3]), 0.0)
    standing = verdict.standing(gmap(cluster))
    assert standing == GangStatus(
        4, 1, ((1, "NodeCordoned"), (2, ""), (3, "NodeCordoned")), False, 600
    )
    assert standing.describe() == (
        "gang: 1 of 4 ranks ready; slot 1 waits NodeCordoned; slot 2 has no pod; "
        "slot 3 waits NodeCordoned"
    )


def test_a_stuck_gang_says_so_and_counts_the_slots_it_does_not_name() -> None:
    stuck = GangStatus(64, 59, tuple((i, "NodeCordoned") for i in range(5)), True, 30)
    assert stuck.describe() == (
        "gang stuck: 59 of 64 ranks ready; slot 0 waits NodeCordoned; slot 1 waits "
        "NodeCordoned; slot 2 waits NodeCordoned; and 2 more (past its timeoutSeconds 30)"
    )


def test_a_bound_gang_has_no_standing_to_show() -> None:
    cluster = gang_cluster()
    verdict = decide(gmap(cluster), members(cluster, SlotCache(), [0, 1, 2, 3]), 0.0)
    assert verdict.bind and verdict.waits == ()


def test_the_annotation_and_the_custom_resource_carry_the_gang_both_ways() -> None:
    status = MapStatus(Phase.VALID, message="4 slots", gang=WAITING)
    assert MapStatus.from_json(status.to_json()).gang == WAITING
    body = resource_status(status, 1, None, "2026-12-02T00:00:00Z")
    assert body["gang"]["waiting"] == [{"slot": 3, "reason": "DeviceBusy"}]
    assert status_from_resource(body).gang == WAITING
    assert MapStatus.from_json(MapStatus(Phase.VALID).to_json()).gang is None


def test_the_gangstuck_condition_is_false_while_the_gang_waits_and_true_past_its_timeout() -> None:
    waiting = {c.type.value: c for c in conditions(MapStatus(Phase.VALID, gang=WAITING))}
    assert (waiting["GangStuck"].status, waiting["GangStuck"].reason) == (False, "GangWaiting")
    assert waiting["GangStuck"].message == "gang: 3 of 4 ranks ready; slot 3 waits DeviceBusy"
    stuck = GangStatus(4, 3, ((3, "DeviceBusy"),), True, 600)
    found = {c.type.value: c for c in conditions(MapStatus(Phase.VALID, gang=stuck))}
    assert (found["GangStuck"].status, found["GangStuck"].reason) == (True, "GangStuck")
    assert "GangStuck" not in {c.type.value for c in conditions(MapStatus(Phase.VALID))}
