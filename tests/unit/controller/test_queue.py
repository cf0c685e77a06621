"""SchedulingQueue: active, backoff and unschedulable, and the moves between them."""

from __future__ import annotations

import threading
from collections import Counter

import pytest

from controller.queue import SchedulingQueue
from placement.types import MapKey, SlotKey
from placement.wake import WakeKey

SLOT = WakeKey.slot(SlotKey(MapKey("ml", "llm"), 0))
NODE = WakeKey.node("gpu-1")
LATER = 3600.0  # a backoff no test waits for


def drain(queue: SchedulingQueue) -> list[str]:
    """Everything poppable now, in order."""
    out = []
    while (uid := queue.pop(timeout=0)) is not None:
        out.append(uid)
    return out


def test_active_pods_pop_in_order_once_however_often_added() -> None:
    queue = SchedulingQueue()
    for uid in ("a", "b", "a", "c", "b"):
        queue.add(uid)
    assert len(queue) == 3
    assert drain(queue) == ["a", "b", "c"]
    assert len(queue) == 0


def test_a_removed_pod_is_not_popped_and_can_come_back() -> None:
    queue = SchedulingQueue()
    queue.add("a")
    queue.add("b")
    queue.remove("a")
    assert drain(queue) == ["b"]
    queue.add("a")
    assert drain(queue) == ["a"]


@pytest.mark.parametrize(
    ("waits_for", "woken", "moved"),
    [
        ({SLOT}, [SLOT], 1),
        ({SLOT, NODE}, [NODE], 1),
        ({SLOT}, [NODE], 0),
        ({SLOT}, [WakeKey.model()], 0),
        ({SLOT, NODE}, [SLOT, NODE], 1),
        (set(), [SLOT], 0),
    ],
)
def test_an_unschedulable_pod_moves_back_only_when_what_it_waits_for_changes(
    waits_for: set[WakeKey], woken: list[WakeKey], moved: int
) -> None:
    queue = SchedulingQueue()
    queue.add("a")
    assert drain(queue) == ["a"]
    queue.unschedulable("a", frozenset(waits_for))
    assert len(queue) == 1
    assert drain(queue) == []
    assert queue.wake(woken) == moved
    assert drain(queue) == (["a"] if moved else [])


def test_a_woken_pod_no_longer_waits_on_its_other_keys() -> None:
    queue = SchedulingQueue()
    queue.unschedulable("a", frozenset({SLOT, NODE}))
    assert queue.wake([SLOT]) == 1
    assert queue.wake([NODE]) == 0
    assert drain(queue) == ["a"]


def test_a_new_verdict_replaces_what_the_pod_waited_for() -> None:
    queue = SchedulingQueue()
    queue.unschedulable("a", frozenset({SLOT}))
    queue.unschedulable("a", frozenset({NODE}))
    assert queue.wake([SLOT]) == 0
    assert queue.wake([NODE]) == 1


def test_adding_or_removing_an_unschedulable_pod_forgets_its_wait() -> None:
    queue = SchedulingQueue()
    queue.unschedulable("a", frozenset({SLOT}))
    queue.add("a")  # the pod changed: decide again now
    assert drain(queue) == ["a"]
    assert queue.wake([SLOT]) == 0
    queue.unschedulable("b", frozenset({SLOT}))
    queue.remove("b")
    assert queue.wake([SLOT]) == 0
    assert len(queue) == 0


def test_wake_all_moves_every_unschedulable_pod() -> None:
    queue = SchedulingQueue()
    queue.unschedulable("a", frozenset({SLOT}))
    queue.unschedulable("b", frozenset({NODE}))
    assert queue.wake_all() == 2
    assert sorted(drain(queue)) == ["a", "b"]


def test_a_backed_off_pod_waits_for_its_delay() -> None:
    queue = SchedulingQueue(initial_backoff=LATER, max_backoff=LATER)
    queue.add("a")
    assert drain(queue) == ["a"]
    queue.backoff("a")
    assert len(queue) == 1
    assert drain(queue) == []
    queue.add("a")  # a change to the pod does not wait for the backoff
    assert drain(queue) == ["a"]


def test_a_backoff_that_is_due_pops_and_a_removed_pods_backoff_does_not() -> None:
    queue = SchedulingQueue(initial_backoff=0.0)
    for uid in ("a", "b"):
        queue.add(uid)
    assert drain(queue) == ["a", "b"]
    queue.backoff("a")
    queue.backoff("b")
    queue.remove("b")
    assert drain(queue) == ["a"]


def test_close_wakes_a_blocked_pop_and_pops_nothing_more() -> None:
    queue = SchedulingQueue()
    popped: list[str | None] = []
    consumer = threading.Thread(target=lambda: popped.append(queue.pop(timeout=LATER)))
    consumer.start()
    queue.close()
    consumer.join(timeout=30)
    assert not consumer.is_alive() and popped == [None]
    queue.add("a")
    assert queue.pop(timeout=0) is None


def test_an_add_wakes_a_blocked_pop() -> None:
    queue = SchedulingQueue()
    popped: list[str | None] = []
    consumer = threading.Thread(target=lambda: popped.append(queue.pop(timeout=LATER)))
    consumer.start()
    queue.add("a")
    consumer.join(timeout=30)
    assert popped == ["a"]


def test_racing_producers_wakers_and_consumers_pop_each_pod_once() -> None:
    """Producers add pods and park half of them as unschedulable; wakers wake them; consumers
    pop. Every pod is popped exactly once: no pod is lost or handed to two consumers."""
    queue = SchedulingQueue()
    pods = [f"p{i}" for i in range(2000)]
    popped: Counter[str] = Counter()
    lock = threading.Lock()
    done = threading.Event()

    def produce(part: list[str]) -> None:
        for uid in part:
            if int(uid[1:]) % 2:
                queue.unschedulable(uid, frozenset({NODE}))
            else:
                queue.add(uid)

    def consume() -> None:
        while not done.is_set():
            uid = queue.pop(timeout=0.05)
            if uid is not None:
                with lock:
                    popped[uid] += 1

    consumers = [threading.Thread(target=consume) for _ in range(4)]
    producers = [threading.Thread(target=produce, args=(pods[i::4],)) for i in range(4)]
    for t in consumers + producers:
        t.start()
    for t in producers:
        t.join()
    queue.wake([NODE])
    for _ in range(600):
        with lock:
            if sum(popped.values()) >= len(pods):
                break
        threading.Event().wait(0.05)
    done.set()
    for t in consumers:
        t.join()
    assert set(popped) == set(pods)
    assert set(popped.values()) == {1}
    assert len(queue) == 0


MAP = WakeKey.map(MapKey("ml", "llm"))
COHORT = "allocate:ml/llm"


def parked_cohort(queue: SchedulingQueue, count: int) -> list[str]:
    uids = [f"p{i}" for i in range(count)]
    for uid in uids:
        queue.unschedulable(uid, frozenset({MAP, WakeKey.model()}), COHORT)
    return uids


def test_a_change_wakes_one_pod_of_a_cohort_and_a_verdict_that_returns_it_stops_there() -> None:
    queue = SchedulingQueue()
    uids = parked_cohort(queue, 300)
    queue.unschedulable("other", frozenset({MAP}))
    assert queue.wake([MAP]) == 2  # the cohort's longest-waiting pod, and the pod of no cohort
    assert sorted(drain(queue)) == ["other", "p0"]
    queue.unschedulable("p0", frozenset({MAP}), COHORT)  # still no slot: the line stops
    assert drain(queue) == []
    assert queue.wake([WakeKey.model()]) == 1
    assert drain(queue) == ["p1"]
    queue.unschedulable("p1", frozenset({MAP}), COHORT)
    assert len(queue) == len(uids)


def test_a_placed_or_gone_pod_of_a_cohort_wakes_the_next() -> None:
    queue = SchedulingQueue()
    parked_cohort(queue, 4)
    queue.wake([MAP])
    assert drain(queue) == ["p0"]
    queue.placed("p0")  # it got a slot: the next may get one too
    assert drain(queue) == ["p1"]
    queue.remove("p1")  # deleted before its decision
    assert drain(queue) == ["p2"]
    queue.unschedulable("p2", frozenset({NODE}))  # waits for something else now
    assert drain(queue) == ["p3"]
    queue.backoff("p3")  # its decision failed
    assert drain(queue) == []  # p2 waits for its node; nothing else is parked in the cohort
    assert queue.wake([MAP]) == 0


def test_wake_all_wakes_one_pod_per_cohort_and_every_other_pod() -> None:
    queue = SchedulingQueue()
    parked_cohort(queue, 50)
    queue.unschedulable("a", frozenset({SLOT}))
    queue.unschedulable("b", frozenset({NODE}))
    assert queue.wake_all() == 3
    assert sorted(drain(queue)) == ["a", "b", "p0"]
