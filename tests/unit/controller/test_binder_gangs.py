"""The binder's gangs (controller/gangs.py): a gang map's pods are bound all at once, when every
rank is there and servable, from one decision; until then none is, and each reports why."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from controller.sources import SourceState, map_status
from kubeio.pod import Pod
from placement.annotations import JOB_COMPLETION_INDEX, MAP_LABEL
from placement.binding import Cluster, NodeState
from placement.compile import MapReport
from placement.maps import Gang
from placement.status import Phase
from placement.types import MapKey, NodeName
from tests.unit.controller.test_binder import Apiserver, binder_for, make_pod, settle
from tests.unit.placement.test_binding_plan import KEY, build
from tests.unit.placement.test_gang import FOUR, NODES


def gang_cluster(cordoned: str = "") -> Cluster:
    nodes = dict(NODES)
    if cordoned:
        nodes[cordoned] = NodeState(NodeName(cordoned), schedulable=False)
    cluster = build(FOUR, nodes=nodes)
    cmap = replace(cluster.model.maps[KEY], gang=Gang(600))
    return replace(cluster, model=replace(cluster.model, maps={KEY: cmap}))


def rank(index: int) -> dict[str, Any]:
    pod = make_pod(f"train-{index}-x2x4z").label(MAP_LABEL, "llm")
    pod = pod.label(JOB_COMPLETION_INDEX, str(index)).obj()
    pod["metadata"]["ownerReferences"] = [{"kind": "Job", "controller": True, "name": "train"}]
    pod["metadata"]["generateName"] = f"train-{index}-"
    return pod


def test_a_gang_binds_only_when_its_last_rank_is_servable_and_then_all_at_once() -> None:
    api = Apiserver()
    cordoned = gang_cluster(cordoned="gpu-2")  # the node of slots 1 and 3
    current = [cordoned]
    binder = binder_for(api, cordoned)
    binder.cluster = lambda: current[0]
    pods = [rank(i) for i in (3, 0, 2, 1)]
    for pod in pods:
        binder.on_pod("ADDED", Pod.of(pod))
        uid = binder.queue.pop(timeout=0)
        assert uid is not None
        binder._decide(uid, Pod.of(pod))
    settle(binder)
    assert api.bindings == []
    assert binder.cache.holding("uid-train-0-x2x4z") is None  # no GPU of the gang is held
    reasons = {e["reason"] for e in api.events}
    assert reasons == {"GangWaiting"}
    # The Events leave from the side threads, in any order: rank 1's was decided last.
    (last,) = [e["message"] for e in api.events if e["involvedObject"]["name"] == "train-1-x2x4z"]
    assert last.startswith("map ml/llm gang: 2 of 4 ranks ready; slot 1 waits NodeCordoned")
    current[0] = gang_cluster()  # uncordoned
    uid = "uid-train-1-x2x4z"
    binder._decide(uid, Pod.of(pods[3]))
    settle(binder)
    bound = sorted(
        (body["metadata"]["annotations"]["gpuplace.io/index"], path) for path, body in api.bindings
    )
    assert bound == [
        (str(i), f"/api/v1/namespaces/ml/pods/train-{i}-x2x4z/binding") for i in range(4)
    ]


def test_the_map_status_follows_the_gang_and_a_stuck_gang_puts_an_event_on_the_map() -> None:
    api = Apiserver()
    cordoned = gang_cluster(cordoned="gpu-2")
    current = [cordoned]
    binder = binder_for(api, cordoned)
    binder.cluster = lambda: current[0]
    now = [0.0]
    changed: list[MapKey] = []
    stuck: list[tuple[MapKey, str]] = []
    binder.gangs.clock = lambda: now[0]
    binder.gangs.on_change = changed.append
    binder.gangs.on_stuck = lambda key, message: stuck.append((key, message))
    pods = [rank(i) for i in range(4)]
    for pod in pods:
        binder.on_pod("ADDED", Pod.of(pod))
        uid = binder.queue.pop(timeout=0)
        assert uid is not None
        binder._decide(uid, Pod.of(pod))
    state = binder.gangs.state(KEY)
    assert state is not None and not state.stuck
    assert state.describe() == (
        "gang: 2 of 4 ranks ready; slot 1 waits NodeCordoned; slot 3 waits NodeCordoned"
    )
    assert set(changed) == {KEY} and stuck == []
    source = SourceState(KEY, "v1", data_hash="h")
    report = MapReport(KEY, Phase.VALID, "4 slots", total=4, served=4)
    status = map_status(source, report, 7, 0, gang=state)
    assert status.message == f"4 slots; {state.describe()}" and status.gang == state
    now[0] = 601.0  # past timeoutSeconds 600
    binder._decide("uid-train-1-x2x4z", Pod.of(pods[1]))
    state = binder.gangs.state(KEY)
    assert state is not None and state.stuck
    assert [key for key, _ in stuck] == [KEY]
    assert "over its timeoutSeconds 600" in stuck[0][1]
    current[0] = gang_cluster()
    binder._decide("uid-train-1-x2x4z", Pod.of(pods[1]))
    settle(binder)
    assert len(api.bindings) == 4
    assert binder.gangs.state(KEY) is None  # bound: the map's status no longer shows a gang
    assert changed[-1] == KEY
