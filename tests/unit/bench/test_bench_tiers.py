"""The scale and GitOps benchmarks' pure parts: the heartbeat renewer, steady pacing, the moves a
GitOps run commits and how a pod version is matched to its new slot."""

from __future__ import annotations

import threading

import pytest

from bench._heartbeats import Renewer
from bench._kube import paced
from bench._report import _waits
from bench._runs import Admission
from bench._workload import gpu_uuid, node_name
from bench.gitops import MOVES, SCALE, _on, away, home, map_text
from kubeio.errors import APIServerError
from placement.validate import parse_map


class FakeBeat:
    def __init__(self, fail: bool = False) -> None:
        self.renewals = 0
        self.fail = fail

    def renew(self) -> None:
        self.renewals += 1
        if self.fail and self.renewals > 1:  # the first write (before `ready`) must succeed
            raise APIServerError(500, "InternalError", "etcd timeout")


def test_the_renewer_renews_every_heartbeat_and_counts_failures() -> None:
    beats = [FakeBeat(), FakeBeat(), FakeBeat(fail=True), FakeBeat()]
    renewer = Renewer(beats, interval=0.05, threads=2)
    renewer.first()
    assert [b.renewals for b in beats] == [1, 1, 1, 1]
    runner = threading.Thread(target=renewer.run, args=(0.0,))
    runner.start()
    while min(b.renewals for b in beats) < 3:
        threading.Event().wait(0.01)
    renewer.stop()
    runner.join(5)
    assert not runner.is_alive()
    assert renewer.renewals == sum(b.renewals for b in beats) - len(beats)
    assert renewer.failures == beats[2].renewals - 1


def test_paced_calls_every_item_once_and_keeps_their_order() -> None:
    seen: list[int] = []
    lock = threading.Lock()

    def call(item: int) -> int:
        with lock:
            seen.append(item)
        return item * 2

    assert paced(list(range(20)), call, rate=10_000.0, threads=3) == [i * 2 for i in range(20)]
    assert sorted(seen) == list(range(20))


def test_home_is_where_the_placement_benchmark_puts_a_slot() -> None:
    assert [home(i) for i in (0, 1, 19, 20, 99)] == [(0, 0), (1, 0), (19, 0), (0, 1), (19, 4)]


@pytest.mark.parametrize("count", MOVES)
def test_a_move_never_puts_two_slots_on_one_gpu_and_the_map_is_valid(count: int) -> None:
    slots = {i: home(i) for i in range(SCALE.pods)}
    for _ in range(3):  # away, back, away
        slots.update({i: home(i) if slots[i] != home(i) else away(i) for i in range(count)})
        assert len(set(slots.values())) == SCALE.pods
        assert all(device < SCALE.gpus for _, device in slots.values())
        parsed = parse_map(map_text(slots), "maps/bench-000.yaml")
        assert {s.index: s.node for s in parsed.slots} == {
            i: node_name(node) for i, (node, _) in slots.items()
        }
        assert parsed.rollout.strategy.value == "evict"
        assert parsed.rollout.max_unavailable == max(MOVES)
    assert all(slots[i] == away(i) for i in range(count))


def test_a_pod_is_on_its_new_slot_only_when_node_and_gpu_both_match_and_it_is_not_going() -> None:
    node, device = away(3)
    pod = {
        "metadata": {
            "name": "serving-3",
            "annotations": {"gpuplace.io/devices": gpu_uuid(node, device)},
        },
        "spec": {"nodeName": node_name(node)},
    }
    match = _on(3, (node, device))
    assert match(pod)
    assert not _on(4, (node, device))(pod)
    assert not _on(3, home(3))(pod)
    pod["metadata"]["deletionTimestamp"] = "2026-11-26T00:00:00Z"
    assert not match(pod)


def test_the_webhook_wait_for_a_cpu_is_reported_per_admission_beside_the_machine_load() -> None:
    steady = [
        Admission(
            {0.005: 9.0, float("inf"): 10.0}, {}, 50.0, webhook_wait=0.0021, machine_busy=1.7
        ),
        Admission(
            {0.005: 10.0, float("inf"): 10.0}, {}, 50.0, webhook_wait=0.0009, machine_busy=1.9
        ),
    ]
    rows = {m.metric: m for m in _waits("b", "at 50 creates/s", steady)}
    wait = rows["webhook threads' wait for a CPU per admission at 50 creates/s"]
    assert (wait.unit, wait.samples) == ("ms", pytest.approx((2.1, 0.9)))
    busy = rows["machine busy at 50 creates/s"]
    assert (busy.unit, busy.samples) == ("CPU s/s", pytest.approx((1.7, 1.9)))
