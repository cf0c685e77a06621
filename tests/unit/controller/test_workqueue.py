"""WorkQueue and Workers (controller/workqueue.py): dedup, one worker per key, first in first out
between keys, per-key backoff, the global rate limit, and the contract under racing threads."""

from __future__ import annotations

import random
import threading
from collections import Counter

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from controller.workqueue import RETRY, QueueCollector, Workers, WorkQueue


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def drain(queue: WorkQueue[str]) -> list[str]:
    """Every key ready now, one at a time, each marked done at once."""
    out = []
    while keys := queue.get(timeout=0):
        out += keys
        for key in keys:
            queue.done(key)
    return out


def test_a_key_is_queued_once_however_often_added() -> None:
    queue: WorkQueue[str] = WorkQueue("q")
    for key in ("a", "b", "a", "c", "b", "a"):
        queue.add(key)
    assert len(queue) == 3
    assert drain(queue) == ["a", "b", "c"]


def test_a_key_added_while_processed_waits_for_done_and_comes_back_once() -> None:
    queue: WorkQueue[str] = WorkQueue("q")
    queue.add("a")
    assert queue.get(timeout=0) == ["a"]
    queue.add("a")
    queue.add("a")
    assert queue.get(timeout=0) == []  # never to a second worker while the first holds it
    queue.done("a")
    assert queue.get(timeout=0) == ["a"]
    queue.done("a")
    assert queue.get(timeout=0) == []


def test_a_key_added_again_and_again_goes_to_the_back_each_time() -> None:
    queue: WorkQueue[str] = WorkQueue("q")
    queue.add_all(["hot", "b", "c"])
    served = []
    for _ in range(6):
        (key,) = queue.get(timeout=0)
        served.append(key)
        if key == "hot":
            queue.add("hot")  # its object changes all the time
        queue.done(key)
    assert served == ["hot", "b", "c", "hot", "hot", "hot"]


def test_failures_back_off_exponentially_per_key_and_forget_starts_over() -> None:
    clock = Clock()
    queue: WorkQueue[str] = WorkQueue("q", base_delay=1.0, max_delay=5.0, clock=clock)
    delays = [queue.retry("a") for _ in range(5)]
    assert delays == [1.0, 2.0, 4.0, 5.0, 5.0]
    assert queue.failures("a") == 5
    queue.add_after("b", 0.5)
    clock.now += 0.9
    assert drain(queue) == ["b"]  # another key's backoff is its own
    clock.now += 0.2
    assert drain(queue) == ["a"]  # due after the first retry's delay: the earliest wins
    queue.forget("a")
    assert queue.retry("a") == 1.0


def test_a_delayed_key_is_ready_at_once_when_added_plainly() -> None:
    clock = Clock()
    queue: WorkQueue[str] = WorkQueue("q", clock=clock)
    queue.add_after("a", 60)
    assert queue.get(timeout=0) == [] and queue.delayed() == 1
    queue.add("a")
    assert drain(queue) == ["a"]
    clock.now += 61
    assert drain(queue) == []  # the delayed entry went with the plain add


def test_the_rate_limit_paces_every_key_together() -> None:
    clock = Clock()
    queue: WorkQueue[str] = WorkQueue("q", qps=2, burst=2, clock=clock)
    queue.add_all(["a", "b", "c", "d", "e"])
    assert queue.get(10, timeout=0) == ["a", "b"]  # the burst
    assert queue.get(10, timeout=0) == []
    clock.now += 0.5
    assert queue.get(10, timeout=0) == ["c"]
    clock.now += 10
    assert queue.get(10, timeout=0) == ["d", "e"]  # refilled to the burst, no more


def test_keys_due_within_one_tick_are_handed_out_together() -> None:
    """With a tick, a delayed key's time is rounded up to the tick: keys added after 0.5 s at
    different moments of one tick come out in one batch, at the tick's end, and not before."""
    clock = Clock()
    clock.now = 1000.01
    queue: WorkQueue[str] = WorkQueue("q", tick=0.1, clock=clock)
    queue.add_after("a", 0.5)  # 1000.51 -> 1000.6
    clock.now = 1000.05
    queue.add_after("b", 0.5)  # 1000.55 -> 1000.6
    clock.now = 1000.12
    queue.add_after("c", 0.5)  # 1000.62 -> 1000.7
    clock.now = 1000.58
    assert queue.get(10, timeout=0) == []
    clock.now = 1000.61
    assert queue.get(10, timeout=0) == ["a", "b"]
    clock.now = 1000.71
    assert queue.get(10, timeout=0) == ["c"]
    untimed: WorkQueue[str] = WorkQueue("q", clock=clock)
    untimed.add_after("a", 0.5)
    clock.now += 0.5
    assert untimed.get(10, timeout=0) == ["a"]  # no tick: at its time exactly


def test_a_waiting_worker_takes_an_earlier_key_first_and_a_later_one_at_its_time() -> None:
    """A worker blocked until the earliest delayed key is woken for a key due sooner; a key due
    later than that needs no wake and is still handed out."""
    queue: WorkQueue[str] = WorkQueue("q")
    queue.add_after("middle", 0.3)
    taken: list[str] = []
    started = threading.Event()

    def worker() -> None:
        started.set()
        while len(taken) < 3 and (keys := queue.get(timeout=10)):
            taken.extend(keys)
            for key in keys:
                queue.done(key)

    thread = threading.Thread(target=worker)
    thread.start()
    assert started.wait(10)
    queue.add_after("late", 0.5)
    queue.add_after("early", 0.01)
    thread.join(20)
    assert taken == ["early", "middle", "late"]


def test_a_bad_rate_limit_is_refused() -> None:
    with pytest.raises(ValueError, match="qps > 0"):
        WorkQueue("q", qps=0)


def test_a_shut_down_queue_hands_out_nothing_and_drops_what_waits() -> None:
    queue: WorkQueue[str] = WorkQueue("q")
    queue.add("a")
    queue.shut_down()
    queue.add("b")
    assert queue.get() == [] and len(queue) == 0


def test_workers_retry_a_failing_key_with_backoff_and_requeue_what_they_ask() -> None:
    queue: WorkQueue[str] = WorkQueue("q", base_delay=0.001)
    calls: Counter[str] = Counter()
    finished = threading.Event()

    def reconcile(keys: list[str]) -> dict[str, float]:
        (key,) = keys
        calls[key] += 1
        if key == "flaky" and calls[key] < 3:
            raise RuntimeError("apiserver unavailable")
        if key == "poll" and calls[key] < 2:
            return {key: 0.001}
        if key == "refused" and calls[key] < 2:
            return {key: RETRY}
        if calls["flaky"] >= 3 and calls["poll"] >= 2 and calls["refused"] >= 2:
            finished.set()
        return {}

    workers = Workers(queue, reconcile).start()
    try:
        queue.add_all(["flaky", "poll", "refused"])
        assert finished.wait(10)
    finally:
        workers.stop()
    assert calls == {"flaky": 3, "poll": 2, "refused": 2}
    assert queue.failures("flaky") == 0  # its success forgot its failures


def test_racing_adders_and_workers_keep_the_contract() -> None:
    """Eight threads add 40 keys at random while four workers take batches: no key is ever held
    by two workers at once, and every add is followed by a reconcile that started after it."""
    queue: WorkQueue[int] = WorkQueue("race")
    lock = threading.Lock()
    added: Counter[int] = Counter()  # key -> adds so far
    seen: dict[int, int] = {}  # key -> adds counted when its latest reconcile started
    held: set[int] = set()
    overlaps: list[int] = []

    def reconcile(keys: list[int]) -> None:
        with lock:
            overlaps.extend(k for k in keys if k in held)
            held.update(keys)
            for key in keys:
                seen[key] = added[key]
        threading.Event().wait(random.random() / 2000)
        with lock:
            held.difference_update(keys)

    def adder(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(500):
            key = rng.randrange(40)
            with lock:
                added[key] += 1
            queue.add(key)

    workers = Workers(queue, reconcile, count=4, batch=3).start()
    adders = [threading.Thread(target=adder, args=(n,)) for n in range(8)]
    for thread in adders:
        thread.start()
    for thread in adders:
        thread.join()
    behind: list[int] = []
    try:
        for _ in range(3000):  # until every add has had a reconcile started after it (30 s)
            with lock:
                behind = [k for k in added if seen.get(k, -1) < added[k]]
            if not behind or not workers.alive():
                break
            threading.Event().wait(0.01)
    finally:
        workers.stop()
    assert behind == []
    assert overlaps == []
    assert set(seen) == set(added)


def test_the_queues_series_read_each_queue_at_scrape_time() -> None:
    queue: WorkQueue[str] = WorkQueue("status", base_delay=60)
    registry = CollectorRegistry()
    registry.register(QueueCollector([Workers(queue, lambda _keys: None)]))
    queue.add_all(["a", "b", "a"])
    queue.retry("c")
    text = generate_latest(registry).decode()
    assert 'gpuplace_controller_queue_depth{queue="status"} 2.0' in text
    assert 'gpuplace_controller_queue_delayed{queue="status"} 1.0' in text
    assert 'gpuplace_controller_queue_adds_total{queue="status"} 3.0' in text
    assert 'gpuplace_controller_queue_retries_total{queue="status"} 1.0' in text
    assert 'gpuplace_controller_queue_longest_batch_seconds{queue="status"} 0.0' in text
