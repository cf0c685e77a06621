"""The parent's supervision of its server processes: a worker that exits is started again, and
one that never gets to serve is given up on, with the parent's error naming it."""

from __future__ import annotations

import sys
from multiprocessing.synchronize import Event

import pytest

from webhook.processes import MAX_FAILED_STARTS, ServerProcesses, WorkerStartError


def never_serves(_index: int, _ready: Event) -> None:
    sys.exit(3)  # as a worker that cannot read its certificate or bind its port


def serves_then_exits(_index: int, ready: Event) -> None:
    ready.set()


def test_a_worker_that_exits_before_serving_each_time_is_given_up_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("webhook.processes.RESTART_BACKOFF_SECONDS", 0.0)
    workers = ServerProcesses(1, never_serves).start()
    starts = {workers.pids[0]}
    try:
        with pytest.raises(WorkerStartError) as failed:
            for _ in range(10 * MAX_FAILED_STARTS):
                workers.supervise(5.0)
                starts.update(workers.pids)
    finally:
        workers.stop(5.0)
        workers.close()
    assert f"exited {MAX_FAILED_STARTS} times in a row before it served" in str(failed.value)
    assert "last exit code 3" in str(failed.value)
    assert len(starts) == MAX_FAILED_STARTS


def test_a_worker_that_served_is_started_again_however_often_it_exits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("webhook.processes.RESTART_BACKOFF_SECONDS", 0.0)
    workers = ServerProcesses(1, serves_then_exits).start()
    starts = {workers.pids[0]}
    try:
        while len(starts) < MAX_FAILED_STARTS + 2:
            workers.supervise(5.0)
            starts.update(workers.pids)
    finally:
        workers.stop(5.0)
        workers.close()
    assert len(starts) >= MAX_FAILED_STARTS + 2
