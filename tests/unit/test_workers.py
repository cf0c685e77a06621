"""The binder's worker threads: calls run, failures are logged, shutdown drains or cancels."""

from __future__ import annotations

import logging
import threading

import pytest

from controller.workers import Workers


def test_calls_run_in_submission_order_on_one_thread() -> None:
    seen: list[int] = []
    workers = Workers(1, "t")
    for i in range(50):
        workers.submit(seen.append, i)
    workers.shutdown()
    assert seen == list(range(50))


def test_calls_run_concurrently_up_to_the_thread_count() -> None:
    count = 4
    barrier = threading.Barrier(count, timeout=5)
    passed: list[int] = []
    workers = Workers(count, "t")
    for i in range(count):
        # Every call waits for all the others: fewer threads than calls breaks the barrier.
        workers.submit(lambda i=i: (barrier.wait(), passed.append(i)))
    workers.shutdown()
    assert sorted(passed) == list(range(count))


def test_a_failing_call_is_logged_and_the_thread_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    seen: list[str] = []

    def fail() -> None:
        raise ValueError("boom")

    workers = Workers(1, "t")
    with caplog.at_level(logging.ERROR, logger="controller.workers"):
        workers.submit(fail)
        workers.submit(seen.append, "after")
        workers.shutdown()
    assert seen == ["after"]
    assert "fail" in caplog.text
    assert "boom" in caplog.text


def test_cancel_drops_the_queued_calls_and_waits_for_the_running_one() -> None:
    started, release = threading.Event(), threading.Event()
    seen: list[str] = []

    def slow() -> None:
        started.set()
        release.wait(5)
        seen.append("slow")

    workers = Workers(1, "t")
    workers.submit(slow)
    assert started.wait(5)
    workers.submit(seen.append, "queued")
    threading.Timer(0.1, release.set).start()
    workers.shutdown(cancel=True)
    assert seen == ["slow"]
    workers.submit(seen.append, "after shutdown")
    assert seen == ["slow"]
