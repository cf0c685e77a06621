"""A waiting pod's reason is written in the order the binder decided it, newest last, however the
worker threads are scheduled; a pod bound meanwhile gets no stale reason."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

from controller.pendingreport import PendingReports
from controller.serialwrites import SerialWrites
from kubeio.events import EventRecorder
from kubeio.pod import Pod
from placement.binding import Code, Status
from placement.reasons import Reason

POD = Pod.of({"metadata": {"namespace": "ml", "name": "web-0", "uid": "u0"}})


class Recorder:
    def __init__(self) -> None:
        self.patches: list[str] = []
        self.events: list[str] = []
        self.calls: list[tuple[Callable[..., None], tuple[Any, ...]]] = []

    def patch(self, _path: str, body: dict[str, Any], **_: Any) -> dict[str, Any]:
        self.patches.append(body["status"]["conditions"][0]["reason"])
        return {}

    def create(self, _path: str, body: dict[str, Any], **_: Any) -> dict[str, Any]:
        self.events.append(body["reason"])
        return body

    def submit(self, fn: Callable[..., None], *args: Any) -> None:
        self.calls.append((fn, args))

    def run_all(self) -> None:
        """Runs the submitted calls newest first: workers may pick them up in any order."""
        calls, self.calls = self.calls, []
        for fn, args in reversed(calls):
            fn(*args)


def waiting(reason: Reason) -> Status:
    return Status(Code.UNSCHEDULABLE, reason, f"{reason}: because", frozenset())


def reports() -> tuple[PendingReports, Recorder]:
    api = Recorder()
    events = EventRecorder(api, "test")  # type: ignore[arg-type]
    return PendingReports(api, events, api.submit), api  # type: ignore[arg-type]


def test_a_newer_reason_is_written_after_the_older_one_by_the_same_worker() -> None:
    pending, api = reports()
    pending.report(POD, waiting(Reason.CLAIM_PENDING))
    pending.report(POD, waiting(Reason.DEVICE_BUSY))  # before the first write ran
    api.run_all()
    assert api.patches == [Reason.CLAIM_PENDING, Reason.DEVICE_BUSY]


def test_the_same_reason_is_written_once_and_a_bound_pod_gets_no_stale_one() -> None:
    pending, api = reports()
    pending.report(POD, waiting(Reason.DEVICE_BUSY))
    api.run_all()
    pending.report(POD, waiting(Reason.DEVICE_BUSY))
    assert api.calls == [] and api.patches == [Reason.DEVICE_BUSY]
    pending.report(POD, waiting(Reason.CLAIM_PENDING))
    pending.forget("u0")  # bound before the write ran
    api.run_all()
    assert api.patches == [Reason.DEVICE_BUSY]
    pending.report(POD, waiting(Reason.DEVICE_BUSY))  # after forget: reported afresh
    api.run_all()
    assert api.patches == [Reason.DEVICE_BUSY, Reason.DEVICE_BUSY]


def test_writes_of_one_key_keep_their_order_on_a_pool_of_threads() -> None:
    written: dict[str, list[int]] = {"a": [], "b": []}
    with ThreadPoolExecutor(8) as pool:
        writes = SerialWrites(pool.submit)
        for i in range(200):
            for key in ("a", "b"):
                writes.put(key, partial(slow_append, written[key], i))
    assert written == {"a": list(range(200)), "b": list(range(200))}


def slow_append(into: list[int], value: int) -> None:
    time.sleep(0.0005 if value % 7 else 0.002)
    into.append(value)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def delayed_reports() -> tuple[PendingReports, Recorder, Clock]:
    api, clock = Recorder(), Clock()
    events = EventRecorder(api, "test")  # type: ignore[arg-type]
    pending = PendingReports(
        api,  # type: ignore[arg-type]
        events,
        api.submit,
        delays={Reason.CLAIM_PENDING: 2.0},
        clock=clock,
    )
    return pending, api, clock


def test_a_claim_pending_pod_is_reported_only_if_it_still_waits_two_seconds_later() -> None:
    pending, api, clock = delayed_reports()
    pending.report(POD, waiting(Reason.CLAIM_PENDING))
    assert pending.next_due() == 102.0
    clock.now = 101.9
    pending.report(POD, waiting(Reason.CLAIM_PENDING))  # decided again: the first sighting counts
    assert pending.flush_due() == 0
    api.run_all()
    assert api.patches == [] and api.events == []
    clock.now = 102.0
    assert pending.flush_due() == 1
    api.run_all()
    assert api.patches == [Reason.CLAIM_PENDING] and api.events == [Reason.CLAIM_PENDING]
    assert pending.next_due() == float("inf")
    clock.now = 110.0
    pending.report(POD, waiting(Reason.CLAIM_PENDING))  # reported already: not again
    assert pending.flush_due() == 0
    api.run_all()
    assert api.patches == [Reason.CLAIM_PENDING]


def test_a_pod_placed_bound_or_waiting_for_something_else_gets_no_late_claim_report() -> None:
    pending, api, clock = delayed_reports()
    other = Pod.of({"metadata": {"namespace": "ml", "name": "web-1", "uid": "u1"}})
    third = Pod.of({"metadata": {"namespace": "ml", "name": "web-2", "uid": "u2"}})
    for pod in (POD, other, third):
        pending.report(pod, waiting(Reason.CLAIM_PENDING))
    pending.settle("u0")  # placed: its Binding is on its way
    pending.forget("u1")  # bound (or deleted)
    pending.report(third, waiting(Reason.DEVICE_BUSY))  # not a claim wait: reported at once
    clock.now = 105.0
    assert pending.flush_due() == 0
    api.run_all()
    assert api.patches == [Reason.DEVICE_BUSY]


def test_reasons_without_a_delay_are_reported_at_once() -> None:
    pending, api, _ = delayed_reports()
    pending.report(POD, waiting(Reason.SLOT_TAKEN))
    api.run_all()
    assert api.patches == [Reason.SLOT_TAKEN] and pending.next_due() == float("inf")
