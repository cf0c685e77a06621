"""`python -m bench.webhookcost [--rounds N] [--nodes N --pods N]`: what a create through
gpuplace's pod webhook costs the apiserver, against the same create through the reference webhook
(`bench/refwebhook`, Go's net/http, HTTP/1.1 over TLS, answering every review with gpuplace's
patch for these pods), in bursts that take turns on one cluster.

`bench.placement` measures each once a repeat, minutes apart, and a single pair of figures moves
by more than the difference it is after. Here the two take turns `--rounds` times on one cluster
(gpuplace's first in each round), and each burst reports, per create: the apiserver's CPU,
etcd's, the webhook's own (gpuplace's webhook processes, or the reference's), and the TCP
connections the machine accepted during it (`/proc/net/snmp` PassiveOpens: the apiserver's new
connections to the webhook, each a TLS handshake; the bench's own client and the watches keep
theirs). The medians and the spread of each side say whether a difference is the webhook's or
the run's.

The cluster is `bench.placement`'s (`--nodes` kwok nodes x 8 GPUs, maps of 100 slots, the real
controller binding every pod, so that each burst ends when every pod is bound).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench import Measurement, below, describe, log_to_stderr, machine, print_tables
from bench._bursts import Bursts
from bench._runs import REFERENCE_CPU, RunResult
from bench._workload import Scale

NAME = "webhookcost"
DEFAULT = Scale(nodes=200, pods=1000, gpus=8, slots_per_map=100)
SMALL = Scale(nodes=50, pods=200, gpus=8, slots_per_map=100)
GPUPLACE, REFERENCE = "gpuplace's webhook", "the reference webhook"
#: The names `bench._bench.ClusterBench.pids` gives the processes whose CPU is read.
APISERVER, ETCD, WEBHOOK = "kube-apiserver", "etcd", "gpuplace webhook"


@dataclass
class Side:
    """One webhook's bursts: per create, milliseconds of CPU and connections accepted."""

    apiserver_ms: list[float] = field(default_factory=list)
    etcd_ms: list[float] = field(default_factory=list)
    webhook_ms: list[float] = field(default_factory=list)
    connections: list[float] = field(default_factory=list)
    creates_per_s: list[float] = field(default_factory=list)

    def add(self, result: RunResult, webhook_cpu: float, opened: int, creates: int) -> None:
        self.apiserver_ms.append(1000 * result.cpu.get(APISERVER, 0.0) / creates)
        self.etcd_ms.append(1000 * result.cpu.get(ETCD, 0.0) / creates)
        self.webhook_ms.append(1000 * webhook_cpu / creates)
        self.connections.append(opened / creates)
        self.creates_per_s.append(result.extra.get("creates_per_s", 0.0))

    def line(self) -> str:
        return (
            f"apiserver {self.apiserver_ms[-1]:.2f} ms, etcd {self.etcd_ms[-1]:.2f} ms, webhook "
            f"{self.webhook_ms[-1]:.2f} ms a create; {self.connections[-1]:.3f} connections "
            f"accepted a create; {self.creates_per_s[-1]:,.0f} creates/s"
        )


def passive_opens() -> int:
    """TCP connections this machine has accepted since it booted."""
    rows = [line.split() for line in Path("/proc/net/snmp").read_text().splitlines()]
    names, values = (row[1:] for row in rows if row[0] == "Tcp:")
    return int(dict(zip(names, values, strict=True))["PassiveOpens"])


def bench(
    scale: Scale, rounds: int, log: Callable[[str], None], workdir: Path | None = None
) -> dict[str, Side]:
    sides = {GPUPLACE: Side(), REFERENCE: Side()}
    with tempfile.TemporaryDirectory(prefix="gpuplace-webhookcost-") as temporary:
        b = Bursts(scale, workdir or Path(temporary), log)
        try:
            b.setup()
            for number in range(1, rounds + 1):
                opened = passive_opens()
                result, _ = b.gpuplace_burst()
                sides[GPUPLACE].add(
                    result, result.cpu.get(WEBHOOK, 0.0), passive_opens() - opened, scale.pods
                )
                log(f"round {number}, {GPUPLACE}: {sides[GPUPLACE].line()}")
                opened = passive_opens()
                result = b.reference_burst()
                sides[REFERENCE].add(
                    result, result.extra[REFERENCE_CPU], passive_opens() - opened, scale.pods
                )
                log(f"round {number}, {REFERENCE}: {sides[REFERENCE].line()}")
        finally:
            b.stop()
    return sides


def measurements(scale: Scale, sides: dict[str, Side]) -> list[Measurement]:
    label = f"{NAME} {scale.label}"
    out: list[Measurement] = []
    for who, side in sides.items():
        out += [
            below(label, f"apiserver CPU a create through {who}", side.apiserver_ms, "ms"),
            below(label, f"etcd CPU a create through {who}", side.etcd_ms, "ms", detail=True),
            below(label, f"{who}'s own CPU a create", side.webhook_ms, "ms"),
            below(
                label,
                f"connections accepted a create through {who}",
                side.connections,
                "",
                detail=True,
            ),
            below(label, f"creates/s through {who}", side.creates_per_s, "/s", detail=True),
        ]
    ours, theirs = sides[GPUPLACE].apiserver_ms, sides[REFERENCE].apiserver_ms
    if ours and theirs:
        out.append(
            below(
                label,
                "apiserver CPU a create, gpuplace's minus the reference's (median of the rounds')",
                [statistics.median(a - b for a, b in zip(ours, theirs, strict=True))],
                "ms",
            )
        )
    return out


def run(repeats: int, small: bool = False) -> list[Measurement]:
    """For `python -m bench`: `repeats` rounds."""
    scale = SMALL if small else DEFAULT
    return measurements(scale, bench(scale, repeats, log_to_stderr(NAME)))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.webhookcost", description=__doc__)
    parser.add_argument("--rounds", type=int, default=5, help="bursts of each (default 5)")
    parser.add_argument("--nodes", type=int, default=DEFAULT.nodes)
    parser.add_argument("--pods", type=int, default=DEFAULT.pods, help="pods a burst")
    parser.add_argument(
        "--workdir", type=Path, help="keep the cluster's files and logs here (default: temporary)"
    )
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    scale = Scale(nodes=args.nodes, pods=args.pods, gpus=DEFAULT.gpus, slots_per_map=100)
    log = log_to_stderr(NAME)
    log(f"machine: {describe(machine())}")
    print_tables(measurements(scale, bench(scale, args.rounds, log, args.workdir)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
