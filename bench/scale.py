"""`make bench-scale` (`python -m bench.scale`): the placement benchmark at the design's scale.

The cluster of `bench.placement` at 5,000 kwok nodes x 8 GPUs with 100 placement maps of 100
slots and 10,000 pods, and what only shows at that size: every node's agent heartbeat, a coordination
Lease renewed by the agents' own code (`agent.heartbeat.Heartbeat`) at their default interval
(`bench._heartbeats`, a process of its own), running through every run as it would in a cluster.
Besides the placement benchmark's figures (burst, drain, kube-scheduler, the Binding ceiling,
admission at steady rates) it measures:

- the heartbeats' cost: renewals per second, the apiserver's and etcd's CPU with and without them
  (idle, nothing to place), renewals that fell behind or failed;
- controller start-up on the existing cluster (lists, compile, cache rebuild) until its first bind,
  with the backlog of every pod pending (the drain);
- a leader failover: a standby replica waits on the Lease; the leader is killed (SIGKILL, so it
  does not hand the Lease over) with the backlog pending; the time from the kill to the standby's
  first bind, against the Lease's duration (5 s here) + 5 s;
- peak RSS of controller and webhook.

Not part of `make bench` (it takes about an hour on two cores). `--nodes`/`--pods` give a smaller
tier; `python -m bench.scale --nodes 50 --pods 200 --repeats 1` runs in a few minutes.
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench import Budget, Measurement, below, log_to_stderr
from bench._cli import Benchmark, cli
from bench._heartbeats import DEFAULT_INTERVAL
from bench._kube import HeartbeatLoad, Heartbeats, create_pods
from bench._report import measurements as placement_measurements
from bench._runs import Results
from bench._steps import PlacementBench, contend
from bench._workload import CREATE_THREADS, NAMESPACE, Scale, gpuplace_pod, node_name
from placement.inventory import INVENTORY_NAMESPACE

NAME = "scale"
DEFAULT = Scale(nodes=5000, pods=10000, gpus=8, slots_per_map=100)
#: The Binding ceiling's concurrency is searched among fewer candidates than in `make bench`:
#: each try is a run of 10,000 pods.
SEARCH = (128, 256)
#: The bench's controllers hold their Lease for 5 s (see `gpuplace_dev.demo.components`).
LEASE_SECONDS = 5.0
TARGET_FAILOVER_S = LEASE_SECONDS + 5.0
#: The processes whose CPU the heartbeats cost.
SERVERS = ("kube-apiserver", "etcd")


@dataclass
class ScaleResults:
    placement: Results
    idle_quiet: dict[str, float] = field(default_factory=dict)
    idle_heartbeats: dict[str, float] = field(default_factory=dict)
    heartbeats: Heartbeats | None = None
    failover: list[float] = field(default_factory=list)
    failover_rate: list[float] = field(default_factory=list)


class ScaleBench(PlacementBench):
    """The placement bench with every node's heartbeat and a standby controller replica."""

    def __init__(
        self,
        scale: Scale,
        workdir: Path,
        log: Callable[[str], None],
        profile_dir: Path | None = None,
        interval: float = DEFAULT_INTERVAL,
    ) -> None:
        super().__init__(scale, workdir, log, profile_dir)
        self.interval = interval
        self.heartbeats: HeartbeatLoad | None = None
        self._replicas = 0

    def start_heartbeats(self) -> None:
        nodes = [node_name(n) for n in range(self.scale.nodes)]
        self.heartbeats = HeartbeatLoad(self.cluster, INVENTORY_NAMESPACE, nodes, self.interval)
        self.log(f"{len(nodes)} agent heartbeats renewing every {self.interval:g} s")

    def stop_heartbeats(self) -> Heartbeats:
        assert self.heartbeats is not None
        done, self.heartbeats = self.heartbeats.stop(), None
        return done

    def background_guess(self) -> float:
        return super().background_guess() + (
            self.scale.nodes / self.interval if self.heartbeats is not None else 0.0
        )

    def pids(self) -> dict[str, int]:
        pids = super().pids()
        if self.heartbeats is not None:
            pids["agent heartbeats"] = self.heartbeats.pid
        return pids

    def failover(self) -> tuple[float, float]:
        """Seconds from killing the leader to the standby's first bind, and the standby's
        pods/s over the backlog."""
        if self.controller is None:
            self.start_controller()
            self.ready("gpuplace controller", gpuplace_pod)
        assert self.components is not None and self.controller is not None
        self._replicas += 1
        standby = self.components.controller(
            self.enforcement,
            identity=f"standby-{self._replicas}",
            name=f"controller-{self._replicas}",
        )
        time.sleep(2 * LEASE_SECONDS)  # the standby is up and has seen the leader renew
        _, pods = self._pods(gpuplace_pod)
        watch = self._watch()
        try:
            leader = self.controller
            assert leader.proc is not None
            self.note_controller_peak()
            leader.proc.send_signal(signal.SIGKILL)
            killed = time.monotonic()
            leader.proc.wait()
            self.controller = standby
            create_pods(self.cluster, NAMESPACE, pods, CREATE_THREADS)
            seen = watch.wait()
        finally:
            watch.stop()
        self.note_controller_peak()
        self._clear(pods)
        times = sorted(seen.bound.values())
        rate = (len(times) - 1) / (times[-1] - times[0]) if times[-1] > times[0] else float("inf")
        return times[0] - killed, rate


def contend_at_scale(
    b: ScaleBench, repeats: int, log: Callable[[str], None], budget: Budget
) -> ScaleResults:
    """Idle load without and with heartbeats, the placement contenders among the heartbeats,
    then `repeats` failovers (each step while `budget` allows it)."""
    quiet = b.idle()
    b.start_heartbeats()
    loaded = b.idle()
    log(
        "idle, apiserver + etcd CPU: "
        f"{_servers(quiet):.3f} s/s without heartbeats, {_servers(loaded):.3f} with"
    )
    results = ScaleResults(contend(b, repeats, log, budget, SEARCH), quiet, loaded)
    for repeat in range(1, repeats + 1):
        if not budget.allows(f"failover {repeat}"):
            break
        seconds, rate = b.failover()
        results.failover.append(seconds)
        results.failover_rate.append(rate)
        log(f"  failover: first bind {seconds:.2f} s after the kill, then {rate:,.0f} pods/s")
    results.placement.controller_peak_mib = b.controller_peak_mib
    results.heartbeats = b.stop_heartbeats()
    log(
        f"heartbeats: {results.heartbeats.per_second:,.0f} renewals/s, "
        f"{results.heartbeats.late} late, {results.heartbeats.failures} failed"
    )
    return results


bench = Benchmark(ScaleBench, "gpuplace-scale", contend_at_scale)


def _servers(idle: dict[str, float]) -> float:
    return sum(idle.get(name, 0.0) for name in SERVERS)


def measurements(scale: Scale, r: ScaleResults) -> list[Measurement]:
    label = f"{NAME} {scale.label}"
    result = [
        below(label, "failover: leader killed -> first bind", r.failover, "s", TARGET_FAILOVER_S),
        below(label, "failover: pods/s after it", r.failover_rate, "pods/s"),
        below(
            label,
            "idle: apiserver + etcd CPU without agent heartbeats",
            [_servers(r.idle_quiet)],
            "s/s",
        ),
        below(
            label,
            "idle: apiserver + etcd CPU with agent heartbeats",
            [_servers(r.idle_heartbeats)],
            "s/s",
        ),
    ]
    if r.heartbeats is not None:
        h = r.heartbeats
        result += [
            below(label, "agent heartbeats: Lease writes/s", [h.per_second], "/s"),
            below(label, "agent heartbeats: renewals late by an interval", [h.late], ""),
            below(label, "agent heartbeats: renewals failed", [h.failures], ""),
            below(
                label,
                "agent heartbeats: renewing process CPU per renewal",
                [1000 * h.cpu / max(1, h.renewals)],
                "ms",
                detail=True,
            ),
        ]
    for process, share in sorted(r.idle_quiet.items()):
        what = f"idle without heartbeats: CPU of {process}"
        result.append(below(label, what, [share], "s/s", detail=True))
    placement = placement_measurements(scale, r.placement)
    return [
        *[m for m in placement if not m.detail],
        *result,
        *[m for m in placement if m.detail],
    ]


_stderr = log_to_stderr("scale")


def main(argv: Sequence[str] | None = None) -> int:
    return cli("python -m bench.scale", __doc__, DEFAULT, 1, bench, measurements, _stderr, argv)


if __name__ == "__main__":
    sys.exit(main())
