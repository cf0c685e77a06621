"""The benchmark's CPU accounting: a component this benchmark starts is its child, and its CPU
is counted under its own name, not again under the benchmark's."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from bench._kube import CpuMeter, process_cpu
from bench.placement import CLIENT, PlacementBench, Scale, Usage

#: Burns a CPU for this many seconds, then waits to be killed.
BURN = 0.4
_BUSY = (
    "import time\n"
    f"end = time.process_time() + {BURN}\n"
    "while time.process_time() < end: pass\n"
    "print('done', flush=True)\n"
    "time.sleep(60)\n"
)


@pytest.fixture
def burner() -> Iterator[subprocess.Popen[str]]:
    child = subprocess.Popen([sys.executable, "-c", _BUSY], stdout=subprocess.PIPE, text=True)
    try:
        yield child
    finally:
        child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()


def test_a_child_counts_in_its_parent_unless_it_is_counted_apart(
    burner: subprocess.Popen[str],
) -> None:
    assert burner.stdout is not None
    assert burner.stdout.readline().strip() == "done"
    me = os.getpid()
    with_child = process_cpu(me)
    without = process_cpu(me, apart={burner.pid})
    assert with_child - without >= BURN * 0.9
    assert process_cpu(burner.pid) >= BURN * 0.9


def test_the_meter_counts_each_named_process_once(burner: subprocess.Popen[str]) -> None:
    meter = CpuMeter({"bench": os.getpid(), "component": burner.pid}).start()
    assert burner.stdout is not None
    assert burner.stdout.readline().strip() == "done"
    time.sleep(0.05)
    used = meter.stop()
    assert used["component"] >= BURN * 0.5
    assert used["bench"] < used["component"]


def test_a_process_counted_apart_is_in_no_named_process(burner: subprocess.Popen[str]) -> None:
    """The ceiling client's processes report their own CPU: a child that ends before the meter
    stops must not take its earlier CPU out of its parent's figure either."""
    assert burner.stdout is not None
    assert burner.stdout.readline().strip() == "done"
    meter = CpuMeter({"bench": os.getpid()}, apart={burner.pid}).start()
    burner.kill()
    burner.wait()
    used = meter.stop()
    assert 0 <= used["bench"] < BURN / 2


def test_a_process_started_meanwhile_is_left_out_of_its_parent(
    burner: subprocess.Popen[str],
) -> None:
    """A binder the bench starts inside the measured block is counted by its own name (after
    the block), not in the benchmark's figure too."""
    meter = CpuMeter({"bench": os.getpid()}).start()
    assert burner.stdout is not None
    assert burner.stdout.readline().strip() == "done"
    used = meter.stop(started={burner.pid})
    assert used["bench"] < BURN / 2
    assert process_cpu(burner.pid) >= BURN * 0.9


class _Watch:
    """Stands for a `PodWatch`: only its process is needed."""

    def __init__(self, pid: int) -> None:
        self.pid = pid


class _Bench(PlacementBench):
    """A `PlacementBench` whose processes are this test's and whose apiserver says nothing."""

    def __init__(self) -> None:  # the cluster is not needed for the accounting
        self.scale = Scale(nodes=1, pods=1, gpus=1, slots_per_map=1)
        self._watchers: set[int] = set()

    def pids(self) -> dict[str, int]:
        return {CLIENT: os.getpid()}

    def _apiserver_metrics(self) -> str:
        return ""


def test_a_pod_watcher_that_ends_inside_a_run_takes_nothing_from_the_bench_client(
    burner: subprocess.Popen[str],
) -> None:
    """The pod watcher is the benchmark process's child and exits before the run's meter stops:
    its CPU is reported apart ("bench pod watch"), so the client's figure neither holds it nor
    loses it (which read as negative CPU for the client)."""
    bench = _Bench()
    bench._watching(_Watch(burner.pid))  # type: ignore[arg-type]
    assert burner.stdout is not None
    assert burner.stdout.readline().strip() == "done"
    usage: list[Usage] = []
    with bench._measuring(usage, []):
        burner.kill()
        burner.wait()
    assert 0 <= usage[0].cpu[CLIENT] < BURN / 2
