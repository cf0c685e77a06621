"""`python -m bench._heartbeats`: the heartbeats of many agents, renewed as the agents renew them.

One `agent.heartbeat.Heartbeat` (the agent's own code) per node, each renewed every
`--interval` seconds (the agent's default, `AgentSettings.interval_seconds`), the nodes spread
evenly over the interval as independently started agents are. Runs in a process of its own so
that its CPU is measured apart from the benchmark's and does not delay it on the GIL.

Protocol: prints ``ready`` once every Lease has been written once, then renews until SIGTERM and
prints one JSON object: {"renewals": n, "failures": n, "late": n, "seconds": s, "cpu": s}
("late": renewals that started more than one interval after their slot, because the apiserver
or this process could not keep up).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Protocol

from agent.heartbeat import Heartbeat
from agent.settings import AgentSettings
from kubeio.client import ClientSettings, Kube
from kubeio.errors import APIError
from placement.types import NodeName

#: How often an agent renews its Lease by default.
DEFAULT_INTERVAL = AgentSettings(node=NodeName("default")).interval_seconds


class _Stopped(Exception):  # noqa: N818 - a signal, not an error
    pass


def _on_term(_signum: int, _frame: FrameType | None) -> None:
    raise _Stopped


class Renewable(Protocol):
    def renew(self) -> None: ...


class Renewer:
    """Renews every heartbeat once an interval, heartbeat i at offset i / n of the interval.

    Contract: `run` on one thread starts `threads` workers, each the only caller of its own
    heartbeats (i % threads); the counters are guarded by `_lock`; `stop` from any thread."""

    def __init__(self, beats: Sequence[Renewable], interval: float, threads: int) -> None:
        self.beats = beats
        self.interval = interval
        self.threads = threads
        self.renewals = 0
        self.failures = 0
        self.late = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()

    def first(self) -> None:
        """Every Lease written once (created or taken over)."""
        with concurrent.futures.ThreadPoolExecutor(self.threads) as pool:
            list(pool.map(lambda beat: beat.renew(), self.beats))

    def run(self, began: float) -> None:
        """Renews until `stop`; each thread owns the heartbeats i with i % threads == its number."""
        workers = [
            threading.Thread(target=self._worker, args=(t, began), daemon=True)
            for t in range(self.threads)
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()

    def stop(self) -> None:
        self._stop.set()

    def _worker(self, number: int, began: float) -> None:
        n = len(self.beats)
        mine = range(number, n, self.threads)
        cycle = 1
        while not self._stop.is_set():
            for i in mine:
                due = began + (cycle + i / n) * self.interval
                delay = due - time.monotonic()
                if delay > 0 and self._stop.wait(delay):
                    return
                late = -delay > self.interval
                try:
                    self.beats[i].renew()
                    failed = False
                except APIError:
                    failed = True
                with self._lock:
                    self.renewals += 1
                    self.failures += failed
                    self.late += late
            cycle += 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench._heartbeats")
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--nodes", type=Path, required=True, help="a file, one node name a line")
    parser.add_argument("--interval", type=float, default=DEFAULT_INTERVAL)
    # Agents renew independently; 64 in flight lets a slow apiserver, not this process, set the pace.
    parser.add_argument("--threads", type=int, default=64)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _on_term)
    settings = AgentSettings(node=NodeName("bench"), interval_seconds=args.interval)
    kube = Kube.connect(ClientSettings(kubeconfig=str(args.kubeconfig), qps_pool=args.threads))
    beats = [
        Heartbeat(
            kube,
            args.namespace,
            NodeName(node),
            f"agent-{node}",
            settings.lease_duration_seconds,
        )
        for node in args.nodes.read_text().split()
    ]
    renewer = Renewer(beats, args.interval, args.threads)
    renewer.first()
    began = time.monotonic()
    print("ready", flush=True)
    with contextlib.suppress(_Stopped):
        renewer.run(began)
    renewer.stop()
    report = {
        "renewals": renewer.renewals,
        "failures": renewer.failures,
        "late": renewer.late,
        "seconds": time.monotonic() - began,
        "cpu": time.process_time(),
    }
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
