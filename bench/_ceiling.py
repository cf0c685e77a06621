"""The Binding ceiling's minimal client: processes x threads that only POST Bindings, and its search.

One Python process runs out of CPU (about 0.85 CPU seconds per second: the GIL) long before the
apiserver of a machine with many cores does, and a ceiling measured from one process is then the
client's, not the apiserver's. So the client runs as P processes of T threads each, every thread
with a keep-alive connection of its own, the pods split between the processes (`split`), and the
search (`search`) tries one process at each of the given thread counts (the single-process search
of old), then 2, 4, ... processes (up to the machine's CPUs, at most `MAX_PROCESSES`) around the
best so far, while more processes still help. On two cores the client processes compete with the
apiserver for the same CPUs, which is why one process stays among the candidates.

`python -m bench._ceiling` is one process of the client. Protocol: reads the Bindings to POST from
``--bindings`` (a JSON list, in the order to send them), opens ``--threads`` connections to the
apiserver, prints ``ready``, waits for one line on stdin, then POSTs the Bindings from ``--threads``
threads (dealt round-robin, as `bench._kube.concurrently` deals) and prints one JSON object:
{"times": [[sent, answered], ...], "cpu": seconds}. "cpu" counts from the line on stdin to the
last answer; the times are time.monotonic(), which on Linux is comparable across processes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from bench._kube import concurrently, expect
from bench._proc import BenchError
from bench._stats import percentile
from gpuplace_dev.localcluster import LocalCluster
from gpuplace_dev.localcluster.process import die_with_parent
from kubeio.client import ClientSettings, Kube
from kubeio.paths import PODS
from kubeio.requests import prepare

T = TypeVar("T")

#: The most client processes the search tries (and never more than the machine has CPUs).
MAX_PROCESSES = 8


# --------------------------------------------------------------------------- the search (pure)


@dataclass(frozen=True, order=True)
class Shape:
    """How the client runs: `processes` processes of `threads` threads each."""

    processes: int
    threads: int

    @property
    def in_flight(self) -> int:
        """Bindings the client has in flight at most: one a thread."""
        return self.processes * self.threads

    def describe(self) -> str:
        plural = "process" if self.processes == 1 else "processes"
        return f"{self.processes} {plural} x {self.threads} threads"


def process_counts(cpus: int, cap: int = MAX_PROCESSES) -> list[int]:
    """1, 2, 4, ... up to the machine's `cpus` and `cap`."""
    counts, p = [], 1
    while p <= max(1, min(cpus, cap)):
        counts.append(p)
        p *= 2
    return counts


def around(best: Shape, processes: int, most_threads: int) -> list[Shape]:
    """The shapes to try with `processes` processes: the threads per process that keep `best`'s
    Bindings in flight, and half and twice that (between 1 and `most_threads`)."""
    middle = max(1, best.in_flight // processes)
    threads = sorted({min(most_threads, max(1, t)) for t in (middle // 2, middle, middle * 2)})
    return [Shape(processes, t) for t in threads]


def search(
    rate: Callable[[Shape], float],
    threads: Sequence[int],
    found: dict[Shape, float],
    log: Callable[[str], None],
    cpus: int,
) -> Shape:
    """Measures `rate` into `found`: one process at each of `threads`, then for 2, 4, ...
    processes (`process_counts`) the shapes `around` the best so far, until a process count beats
    none of the shapes before it. Returns the fastest shape."""

    def measure(shape: Shape) -> float:
        if shape not in found:
            found[shape] = rate(shape)
            log(f"ceiling search: {shape.describe()}: {found[shape]:,.0f} pods/s")
        return found[shape]

    for t in threads:
        measure(Shape(1, t))
    most = max(threads)
    for processes in process_counts(cpus)[1:]:
        before = max(found.values())
        best = max(found, key=lambda s: found[s])
        if max(measure(s) for s in around(best, processes, most)) <= before:
            break  # more processes did not help: the client is not what limits the rate
    return max(found, key=lambda s: found[s])


def split(items: Sequence[T], processes: int) -> list[list[T]]:
    """Item i goes to process i % `processes`: with each process dealing its share round-robin
    over its threads, thread t of process p sends items p + processes * (t + threads * k), so
    every thread works through the whole order, as the threads of one process do."""
    return [list(items[p::processes]) for p in range(max(1, min(processes, len(items))))]


# --------------------------------------------------------------------------- one run, from the bench


@dataclass(frozen=True)
class Posted:
    """What the client's processes did in one run: each Binding's (sent, answered) times and the
    CPU seconds of all its processes, from the start signal to their last answer."""

    times: tuple[tuple[float, float], ...]
    cpu: float

    @property
    def latencies(self) -> list[float]:
        return [done - sent for sent, done in self.times]

    def p(self, q: float) -> float:
        return percentile(self.latencies, q)

    @property
    def rate(self) -> float:
        """Bindings per second as the client saw them answered."""
        seconds = max(done for _, done in self.times) - min(sent for sent, _ in self.times)
        return len(self.times) / seconds if seconds > 0 else float("inf")


class BindingClient:
    """The client's processes for one run, each connected and waiting once this returns; `go`
    starts them all, `wait` collects what they did, `stop` ends any still running. Used from one
    thread."""

    def __init__(
        self, cluster: LocalCluster, bindings: Sequence[Any], shape: Shape, directory: Path
    ) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        layout = cluster.layout
        self.shape = shape
        self._procs: list[subprocess.Popen[str]] = []
        try:
            for number, share in enumerate(split(bindings, shape.processes)):
                listing = directory / f"bindings-{number}.json"
                listing.write_text(json.dumps(share))
                argv = [
                    sys.executable,
                    "-m",
                    "bench._ceiling",
                    f"--server={cluster.server}",
                    f"--ca={cluster.ca_file}",
                    f"--cert={layout.cert('admin')}",
                    f"--key={layout.key('admin')}",
                    f"--threads={shape.threads}",
                    f"--bindings={listing}",
                ]
                self._procs.append(_start(argv))
            for number, proc in enumerate(self._procs):
                assert proc.stdout is not None
                first = proc.stdout.readline().strip()
                if first != "ready":
                    proc.kill()
                    _, err = proc.communicate()
                    raise BenchError(f"{self._name(number)} did not start: {err[-800:]}")
        except BaseException:
            self.stop()
            raise

    def _name(self, number: int) -> str:
        return f"ceiling client process {number + 1} of {len(self._procs)}"

    @property
    def pids(self) -> list[int]:
        return [proc.pid for proc in self._procs]

    def go(self) -> None:
        for proc in self._procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()

    def wait(self, timeout: float) -> Posted:
        deadline = time.monotonic() + timeout
        times: list[tuple[float, float]] = []
        cpu = 0.0
        for number, proc in enumerate(self._procs):
            try:
                out, err = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired as exc:
                self.stop()
                raise BenchError(f"{self._name(number)}: not done in {timeout:.0f} s") from exc
            lines = out.strip().splitlines()
            if proc.returncode != 0 or not lines:
                self.stop()
                raise BenchError(f"{self._name(number)} failed ({proc.returncode}): {err[-800:]}")
            data = json.loads(lines[-1])
            times += [(float(sent), float(done)) for sent, done in data["times"]]
            cpu += float(data["cpu"])
        return Posted(tuple(times), cpu)

    def stop(self) -> None:
        """Kills the processes still running (idempotent)."""
        for proc in self._procs:
            if proc.poll() is None:
                proc.kill()
            proc.communicate()

    def __enter__(self) -> BindingClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


def _start(argv: Sequence[str]) -> subprocess.Popen[str]:
    """A client process that dies with this one; stdin, stdout and stderr are pipes."""
    return subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=die_with_parent(os.getpid()),  # noqa: PLW1509 - prctl only
    )


# --------------------------------------------------------------------------- one process


def post_all(kube: Kube, bindings: Sequence[Any], threads: int) -> list[tuple[float, float]]:
    """POSTs every Binding from `threads` threads; each one's (sent, answered) times. The answer
    is read only when it is not 201 (a minimal client has nothing to learn from a success)."""

    def bind(body: Any) -> tuple[float, float]:
        name = body["metadata"]["name"]
        request = prepare(
            "POST", PODS.item(name, body["metadata"]["namespace"], "binding"), body=body
        )
        sent = time.monotonic()
        response = kube.send(request)
        done = time.monotonic()
        if response.status != 201:
            expect(response.status, response.json(), {201}, f"Binding of pod {name}")
        return sent, done

    return concurrently(bindings, bind, threads)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench._ceiling")
    parser.add_argument("--server", required=True)
    parser.add_argument("--ca", type=Path, required=True)
    parser.add_argument("--cert", type=Path, required=True)
    parser.add_argument("--key", type=Path, required=True)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--bindings", type=Path, required=True, help="a JSON list of Bindings")
    args = parser.parse_args(argv)
    bindings = json.loads(args.bindings.read_text())
    settings = ClientSettings(qps_pool=args.threads)  # every thread keeps its connection
    kube = Kube.with_client_certificate(args.server, args.ca, args.cert, args.key, settings)
    threads = max(1, min(args.threads, len(bindings)))
    # Every thread's connection opened (TCP, TLS) before the start: the threads start together,
    # so each takes a new one.
    concurrently(list(range(threads)), lambda _: kube.send(prepare("GET", "/version")), threads)
    print("ready", flush=True)
    if not sys.stdin.readline():
        return 1  # the bench went away
    began = time.process_time()
    times = post_all(kube, bindings, args.threads)
    cpu = time.process_time() - began
    print(json.dumps({"times": times, "cpu": cpu}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
