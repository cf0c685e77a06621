"""What one run of a placement benchmark measured (`RunResult`, `Admission`), what it cost
(`Usage`), and every run of a placement bench (`Results`)."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field

from bench._ceiling import Shape
from bench._kube import MACHINE, OTHERS, CpuSampler, Observed
from bench._stats import Buckets, percentile

#: The bench's own process, and the ceiling client's processes counted with it.
CLIENT = "bench client"
#: The webhook's process in a run's CPU figures (with its server processes, if several).
WEBHOOK = "gpuplace webhook"
#: The apiserver's process in a run's CPU figures.
APISERVER = "kube-apiserver"
#: The processes whose CPU a drain also reports from its first bind to its last: the binder's
#: is set against what its Bindings and watches cost the control plane in the same stretch.
ETCD, KWOK = "etcd", "kwok"
WINDOWED = (APISERVER, ETCD, KWOK)
#: In a drain's extra figures: the binder's CPU seconds per pod from its first bind to its last.
BINDING_CPU = "binder CPU per pod, first -> last bind"
#: The same for the binder's own process, its bind processes left out (equal without them).
LEADER_CPU = "binder's own process CPU per pod, first -> last bind"
#: The reference webhook's CPU over its burst (seconds), in the burst's extra.
REFERENCE_CPU = "reference webhook CPU"
#: A candidate server's CPU over its burst (seconds, its processes together), in the burst's extra.
CANDIDATE_CPU = "candidate server CPU"


@dataclass(frozen=True)
class RunResult:
    """One run of one contender: throughput, latency (burst only) and CPU of every process."""

    rate: float
    seconds: float
    p50: float | None = None
    p99: float | None = None
    cpu: dict[str, float] = field(default_factory=dict)
    extra: dict[str, float] = field(default_factory=dict)
    #: Per pod placed: API requests by verb and resource (apiserver_request_total), seconds
    #: waited in API Priority and Fairness queues by priority level.
    requests: dict[str, float] = field(default_factory=dict)
    #: Pods the run bound.
    pods: int = 0

    def line(self) -> str:
        """The run in one log line."""
        latency = f", p50 {self.p50:.3f} s, p99 {self.p99:.3f} s" if self.p50 is not None else ""
        if CREATE_P99 in self.extra:
            latency += (
                f" (the create p99 {self.extra[CREATE_P99]:.3f} s; "
                f"answered -> bound p99 {self.extra[AFTER_CREATE_P99]:.3f} s, "
                f"first seen -> bound {self.extra.get(SEEN_P99, math.nan):.3f} s)"
            )
        return f"{self.rate:,.0f} pods/s{latency}"


@dataclass(frozen=True)
class Usage:
    """What a run cost: CPU seconds by process, apiserver requests per pod, over `seconds`."""

    cpu: dict[str, float]
    requests: dict[str, float]
    seconds: float
    #: The control plane's processes sampled through the run (`WINDOWED`), so that a drain can
    #: say what each spent between its first bind and its last, as it does of the binder.
    samplers: dict[str, CpuSampler] = field(default_factory=dict)

    def add(self, process: str, seconds: float) -> None:
        """Names the CPU of a process that started during the run (the machine total has it)."""
        self.cpu[process] = seconds
        self.cpu[OTHERS] -= seconds

    def charge(self, process: str, seconds: float) -> None:
        """Counts as `process`'s the CPU of helpers that were not named when the run began
        (the ceiling client's processes): the machine total has it."""
        self.cpu[process] = self.cpu.get(process, 0.0) + seconds
        self.cpu[OTHERS] -= seconds

    def with_watcher(self, seen: Observed) -> dict[str, float]:
        """The CPU figures with the pod watcher's own, which the machine total already holds."""
        cpu = dict(self.cpu)
        cpu["bench pod watch"] = seen.cpu
        cpu[OTHERS] -= seen.cpu
        return cpu

    @property
    def busy(self) -> float:
        """The share of all cores that the whole machine used."""
        return self.cpu[MACHINE] / (self.seconds * (os.cpu_count() or 1))


#: A burst's extra figures that split its create -> bound latency at the create's answer: the
#: create itself (the webhook's round trip and the apiserver's write) and what follows it (the
#: watch event to the binder, its decision, the Binding, the bound pod's event to the bench).
CREATE_P99, AFTER_CREATE_P50, AFTER_CREATE_P99 = (
    "create sent -> answered p99 s",
    "create answered -> bound p50 s",
    "create answered -> bound p99 s",
)
#: The part of the latter from the bench's watch's first sight of the pod: the binder's share
#: (its own watch event, decision and Binding) and the bound pod's event.
SEEN_P99 = "first seen -> bound p99 s"


def burst_result(
    sent: dict[str, float],
    seen: Observed,
    usage: Usage,
    answered: dict[str, float] | None = None,
) -> RunResult:
    """A burst's figures; with `answered` (each create's answer, as `create_pods` notes it), its
    latency split at the answer (`CREATE_P99`, `AFTER_CREATE_P50`, `AFTER_CREATE_P99`)."""
    latencies = [seen.bound[name] - t for name, t in sent.items()]
    seconds = max(seen.bound[name] for name in sent) - min(sent.values())
    creating = max(sent.values()) - min(sent.values())
    split: dict[str, float] = {}
    if answered:
        creates = [answered[name] - t for name, t in sent.items()]
        after = [seen.bound[name] - answered[name] for name in sent]
        split = {
            CREATE_P99: percentile(creates, 0.99),
            AFTER_CREATE_P50: percentile(after, 0.5),
            AFTER_CREATE_P99: percentile(after, 0.99),
        }
        if seen_first := [
            seen.bound[name] - seen.added[name] for name in sent if name in seen.added
        ]:
            split[SEEN_P99] = percentile(seen_first, 0.99)
    return RunResult(
        rate=len(sent) / seconds,
        seconds=seconds,
        pods=len(sent),
        p50=percentile(latencies, 0.5),
        p99=percentile(latencies, 0.99),
        cpu=usage.with_watcher(seen),
        extra={
            "creates_per_s": len(sent) / creating if creating > 0 else float("inf"),
            "machine_busy_share": usage.busy,
            "pod watch restarts": float(seen.restarts),
            **split,
        },
        requests=usage.requests,
    )


def drain_result(seen: Observed, started: float, usage: Usage) -> RunResult:
    times = sorted(seen.bound.values())
    seconds = times[-1] - times[0]
    windowed = {
        window_cpu(name): sampler.between(times[0], times[-1]) / max(1, len(times) - 1)
        for name, sampler in usage.samplers.items()
    }
    return RunResult(
        rate=(len(times) - 1) / seconds if seconds > 0 else float("inf"),
        seconds=seconds,
        pods=len(times),
        cpu=usage.with_watcher(seen),
        requests=usage.requests,
        extra={
            "machine_busy_share": usage.busy,
            "pod watch restarts": float(seen.restarts),
            "start_to_first_bound_s": times[0] - started,
            "start_to_all_bound_s": times[-1] - started,
            **windowed,
        },
    )


def window_cpu(process: str) -> str:
    """The name of a drain's extra figure: `process`'s CPU seconds per pod, first to last bind."""
    return f"{process} CPU per pod, first -> last bind"


@dataclass(frozen=True)
class Admission:
    """Admission latency histograms (bucket deltas over one burst)."""

    apiserver: Buckets
    webhook: Buckets
    #: Creates per second as sent (a burst: as fast as the threads went).
    rate: float = float("nan")
    #: Seconds the webhook's threads waited for a CPU (runnable, not running) per admission.
    webhook_wait: float = float("nan")
    #: CPU seconds per second the whole machine was busy while the pods were created.
    machine_busy: float = float("nan")
    #: Each webhook call as the apiserver's trace timed it (seconds), of `creates` creates.
    traced: tuple[float, ...] = ()
    creates: int = 0
    #: The same creates' etcd writes as the apiserver's traces timed them (seconds): no gpuplace
    #: code runs there, so their tail is what the machine adds to any request.
    etcd: tuple[float, ...] = ()


@dataclass
class Results:
    gpuplace_burst: list[RunResult] = field(default_factory=list)
    #: The same burst with the pod webhook unregistered (creates/s without it).
    gpuplace_burst_unhooked: list[RunResult] = field(default_factory=list)
    #: The same burst through the reference webhook (Go, a fixed answer: gpuplace's patch).
    reference_burst: list[RunResult] = field(default_factory=list)
    gpuplace_drain: list[RunResult] = field(default_factory=list)
    scheduler_burst: list[RunResult] = field(default_factory=list)
    scheduler_drain: list[RunResult] = field(default_factory=list)
    ceiling: list[RunResult] = field(default_factory=list)
    #: The ceiling's search: pods/s of each shape of the minimal client tried.
    ceiling_search: dict[Shape, float] = field(default_factory=dict)
    idle_cpu: dict[str, float] = field(default_factory=dict)
    admission: list[Admission] = field(default_factory=list)
    admission_sequential: list[Admission] = field(default_factory=list)
    admission_steady: dict[int, list[Admission]] = field(default_factory=dict)
    #: The steady rate of the target (`TARGET_STEADY_RATE`) through the reference webhook.
    reference_steady: list[Admission] = field(default_factory=list)
    #: By candidate server of gpuplace's webhook app (`bench._candidates.ENGINES`): the same burst
    #: and the target's steady rate through it (none for one that did not run).
    candidate_burst: dict[str, list[RunResult]] = field(default_factory=dict)
    candidate_steady: dict[str, list[Admission]] = field(default_factory=dict)
    controller_peak_mib: float = 0.0
    webhook_peak_mib: float = 0.0


def traced_ms(admissions: Sequence[Admission], q: float, etcd: bool = False) -> list[float]:
    """Each admission's quantile `q` of its traced webhook calls (or of its etcd writes), ms."""
    timed = [a.etcd if etcd else a.traced for a in admissions]
    return [1000 * percentile(t, q) if t else float("nan") for t in timed]
