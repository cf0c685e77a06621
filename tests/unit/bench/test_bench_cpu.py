"""The benchmark's CPU accounting: a component this benchmark starts is its child, and its CPU
is counted under its own name, not again under the benchmark's."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from bench._kube import CpuMeter, CpuSampler, process_cpu
from bench._runs import CLIENT, Usage
from bench._steps import PlacementBench
from bench._workload import Scale

#: Burns a CPU for this many seconds, then waits to be killed.
BURN = 0.4
_BUSY = (
    "import time\n"
    f"end = time.process_time() + {BURN}\n"
    "while time.process_time() < end: pass\n"
    "print('done', flush=True)\n"
    "time.sleep(60)\n"
)


#: The parent this test measures in place of its own process: pytest's process has other
#: children in a whole run (the suite's local cluster), which burn CPU while a meter runs.
#: It starts the burner when told to, reports the burner's pid, reaps it, and idles.
_PARENT = (
    "import subprocess, sys\n"
    "sys.stdin.readline()\n"
    f"child = subprocess.Popen([sys.executable, '-c', {_BUSY!r}])\n"
    "print(child.pid, flush=True)\n"
    "child.wait()\n"
    "print('reaped', flush=True)\n"
    "sys.stdin.readline()\n"
)


class Family:
    """An idle parent and, once `start()`ed, its one child that burns `BURN` CPU seconds."""

    def __init__(self) -> None:
        self.parent = subprocess.Popen(
            [sys.executable, "-c", _PARENT],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.burner = 0

    def start(self) -> Family:
        assert self.parent.stdin is not None and self.parent.stdout is not None
        self.parent.stdin.write("go\n")
        self.parent.stdin.flush()
        self.burner = int(self.parent.stdout.readline())
        return self

    def burnt(self) -> None:
        """Returns once the burner has used its CPU."""
        assert self.parent.stdout is not None
        assert self.parent.stdout.readline().strip() == "done"

    def kill_burner(self) -> None:
        """Returns once the parent has reaped its killed child."""
        assert self.parent.stdout is not None
        os.kill(self.burner, signal.SIGKILL)
        assert self.parent.stdout.readline().strip() == "reaped"

    def close(self) -> None:
        if self.burner:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.burner, signal.SIGKILL)
        self.parent.kill()
        self.parent.wait()
        for stream in (self.parent.stdin, self.parent.stdout):
            if stream is not None:
                stream.close()


@pytest.fixture
def family() -> Iterator[Family]:
    made = Family()
    try:
        yield made
    finally:
        made.close()


def test_a_child_counts_in_its_parent_unless_it_is_counted_apart(family: Family) -> None:
    family.start().burnt()
    with_child = process_cpu(family.parent.pid)
    without = process_cpu(family.parent.pid, apart={family.burner})
    assert with_child - without >= BURN * 0.9
    assert process_cpu(family.burner) >= BURN * 0.9


def test_a_sampler_of_the_process_alone_leaves_its_children_out(family: Family) -> None:
    """A drain's leader with bind processes: its own CPU beside its and its workers'."""
    whole = CpuSampler(family.parent.pid, period=0.01)
    own = CpuSampler(family.parent.pid, period=0.01, descendants=False)
    started = time.monotonic()
    family.start().burnt()
    time.sleep(0.05)
    ended = time.monotonic()
    whole.stop()
    own.stop()
    assert whole.between(started, ended) >= BURN * 0.9
    assert own.between(started, ended) < BURN / 2


def test_the_meter_counts_each_named_process_once(family: Family) -> None:
    family.start()
    meter = CpuMeter({"bench": family.parent.pid, "component": family.burner}).start()
    family.burnt()
    time.sleep(0.05)
    used = meter.stop()
    assert used["component"] >= BURN * 0.5
    assert used["bench"] < used["component"]


def test_a_process_counted_apart_is_in_no_named_process(family: Family) -> None:
    """The ceiling client's processes report their own CPU: a child that ends before the meter
    stops must not take its earlier CPU out of its parent's figure either."""
    family.start().burnt()
    meter = CpuMeter({"bench": family.parent.pid}, apart={family.burner}).start()
    family.kill_burner()
    used = meter.stop()
    assert 0 <= used["bench"] < BURN / 2


def test_a_process_started_meanwhile_is_left_out_of_its_parent(family: Family) -> None:
    """A binder the bench starts inside the measured block is counted by its own name (after
    the block), not in the benchmark's figure too."""
    meter = CpuMeter({"bench": family.parent.pid}).start()
    family.start().burnt()
    used = meter.stop(started={family.burner})
    assert used["bench"] < BURN / 2
    assert process_cpu(family.burner) >= BURN * 0.9


class _Watch:
    """Stands for a `PodWatch`: only its process is needed."""

    def __init__(self, pid: int) -> None:
        self.pid = pid


class _Bench(PlacementBench):
    """A `PlacementBench` whose processes are this test's and whose apiserver says nothing."""

    def __init__(self, client: int) -> None:  # the cluster is not needed for the accounting
        self.scale = Scale(nodes=1, pods=1, gpus=1, slots_per_map=1)
        self._watchers: set[int] = set()
        self._client = client

    def pids(self) -> dict[str, int]:
        return {CLIENT: self._client}

    def apiserver_metrics(self) -> str:
        return ""


def test_a_pod_watcher_that_ends_inside_a_run_takes_nothing_from_the_bench_client(
    family: Family,
) -> None:
    """The pod watcher is the benchmark process's child and exits before the run's meter stops:
    its CPU is reported apart ("bench pod watch"), so the client's figure neither holds it nor
    loses it (which read as negative CPU for the client)."""
    family.start()
    bench = _Bench(family.parent.pid)
    bench._watching(_Watch(family.burner))  # type: ignore[arg-type]
    family.burnt()
    usage: list[Usage] = []
    with bench._measuring(usage, []):
        family.kill_burner()
    assert 0 <= usage[0].cpu[CLIENT] < BURN / 2
