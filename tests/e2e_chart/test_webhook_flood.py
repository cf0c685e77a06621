"""The installed chart's webhook under a flood on the real node: unfinished 3 MiB bodies and idle
TLS connections sent to its pod (the host reaches pod IPs over the node's bridge, nothing leaves
the machine) from two addresses of their own, as a tenant's two pods would send them (the
apiserver's is the bridge's gateway), while pods of a map are created through the apiserver. Its
container stays under its memory limit (read from its cgroup; never OOM-killed), every admission is answered (the
apiserver gives the webhook `ADMISSION_TIMEOUT` seconds, failurePolicy Fail), and the refusals are
counted in its metrics.

One webhook replica, so that every admission goes through the flooded pod. `-rP` prints the
figures (peak memory, admission latencies as the client saw them)."""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from bench._stats import percentile
from bench.flood import in_batches, open_body, open_idle, refusals
from gpuplace_dev.localcluster import LocalCluster, chart
from gpuplace_dev.localcluster.realnode import TENANT_ADDRESSES
from placement.annotations import MAP_LABEL
from tests.e2e_chart.conftest import Installed, chart_on_the_real_node
from tests.integration.controllerkit import map_yaml, placement_configmap, wait_for
from tests.integration.test_real_node import probe_pod
from webhook.settings import DEFAULT_MAX_BODY_BYTES
from webhook.tlsbootstrap import CA_CERT_KEY

#: How long the apiserver waits for the webhook's answer; past it the create is refused.
ADMISSION_TIMEOUT = 3
#: Unfinished bodies (the pool holds about 21 of them, the rest are answered 503) and idle
#: connections (4 times the cap of 512: most are evicted; from two addresses, each of which may
#: hold half, so together they fill the port), held `HOLD_SECONDS` once all are open.
BODIES, IDLE, HOLD_SECONDS = 100, 2000, 15.0
MiB = 1024 * 1024
#: Every phase's refusal the flood must cause.
EXPECTED_REFUSALS = ("buffer", "evicted")


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    values = {"webhook": {"replicas": 1, "timeoutSeconds": ADMISSION_TIMEOUT}}
    with chart_on_the_real_node(tmp_path_factory, [values]) as running:
        yield running


def webhook_pod(cluster: LocalCluster) -> dict[str, Any]:
    [pod] = [
        p
        for p in chart.component_pods(cluster)
        if p["metadata"]["labels"]["app.kubernetes.io/component"] == "webhook"
    ]
    return pod


def tls_context(cluster: LocalCluster) -> ssl.SSLContext:
    """Trusts the webhook's bootstrapped CA; the pod IP is not among the certificate's names."""
    status, secret = cluster.request(
        "GET", f"/api/v1/namespaces/{chart.NAMESPACE}/secrets/gpuplace-webhook-ca"
    )
    assert status == 200, secret
    context = ssl.create_default_context(
        cadata=base64.b64decode(secret["data"][CA_CERT_KEY]).decode()
    )
    context.check_hostname = False
    return context


@dataclass(frozen=True)
class MemoryCgroup:
    """A container's memory cgroup on the host (cgroup v1 or v2)."""

    path: Path
    v2: bool

    @classmethod
    def of(cls, pod: dict[str, Any]) -> MemoryCgroup:
        uid = pod["metadata"]["uid"]
        [status] = pod["status"]["containerStatuses"]
        container = status["containerID"].split("://", 1)[1]
        for root, v2 in ((Path("/sys/fs/cgroup/memory"), False), (Path("/sys/fs/cgroup"), True)):
            for qos in ("burstable", "besteffort", ""):
                path = root / "kubepods" / qos / f"pod{uid}" / container
                if path.is_dir():
                    return cls(path, v2)
        raise AssertionError(f"no memory cgroup of container {container} of pod {uid}")

    def _read(self, v1: str, v2: str) -> int:
        text = (self.path / (v2 if self.v2 else v1)).read_text().strip()
        return 2**63 if text == "max" else int(text)

    def limit(self) -> int:
        return self._read("memory.limit_in_bytes", "memory.max")

    def current(self) -> int:
        return self._read("memory.usage_in_bytes", "memory.current")

    def peak(self) -> int:
        """The most it held since the container started (the kernel's own high-water mark)."""
        return self._read("memory.max_usage_in_bytes", "memory.peak")


@dataclass
class Admissions:
    """Creates a pod of map `map_name` (dry run: admitted, mutated, not stored) every 0.2 s
    through the apiserver, from a thread, until stopped."""

    cluster: LocalCluster
    namespace: str
    map_name: str
    latencies: list[float] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def _run(self) -> None:
        body = probe_pod("flood-probe", self.namespace, labels={MAP_LABEL: self.map_name})
        path = f"/api/v1/namespaces/{self.namespace}/pods?dryRun=All"
        while not self._stop.wait(0.2):
            started = time.monotonic()
            status, response = self.cluster.request("POST", path, body)
            if status == 201 and response["spec"].get("schedulerName") == "gpuplace":
                self.latencies.append(time.monotonic() - started)
            else:
                message = response.get("message") if isinstance(response, dict) else response
                self.refused.append(f"{status}: {message}")

    def __enter__(self) -> Admissions:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(60)


@dataclass
class Sampler:
    """The cgroup's memory every 0.1 s, from a thread: the highest seen."""

    cgroup: MemoryCgroup
    highest: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            self.highest = max(self.highest, self.cgroup.current())

    def __enter__(self) -> Sampler:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(10)


@dataclass
class Flood:
    bodies_held: int = 0
    idle_opened: int = 0
    seconds_to_open: float = 0.0


async def flood(host: str, port: int, context: ssl.SSLContext) -> Flood:
    """Bodies, then idle connections, from the tenant's addresses to the pod (each the other's in
    turn); held, then closed."""
    started = time.monotonic()
    sources = TENANT_ADDRESSES
    bodies = await in_batches(
        [
            open_body(port, context, DEFAULT_MAX_BODY_BYTES, host=host, source=sources[n % 2])
            for n in range(BODIES)
        ],
        50,
    )
    idle = await in_batches(
        [open_idle(port, context, host=host, source=sources[n % 2]) for n in range(IDLE)], 250
    )
    opened = time.monotonic() - started
    await asyncio.sleep(HOLD_SECONDS)
    for writer in [*bodies, *idle]:
        if writer is not None:
            writer.transport.abort()
    return Flood(
        bodies_held=sum(w is not None for w in bodies),
        idle_opened=sum(w is not None for w in idle),
        seconds_to_open=opened,
    )


def ms(seconds: list[float]) -> str:
    values = sorted(s * 1000 for s in seconds)
    if not values:
        return "-"
    return (
        f"p50 {percentile(values, 0.5):.0f} / p99 {percentile(values, 0.99):.0f} / "
        f"max {values[-1]:.0f} ms"
    )


def test_a_flood_of_the_webhook_pod_stays_under_its_memory_limit_while_pods_are_admitted(
    installed: Installed, ns: str
) -> None:
    cluster = installed.cluster
    text = map_yaml(ns, "llm", [(0, "localhost", [0])])
    cluster.kubectl("apply", "-f", "-", input=json.dumps(placement_configmap(ns, "llm", text)))
    pod = webhook_pod(cluster)
    host, port = pod["status"]["podIP"], pod["spec"]["containers"][0]["ports"][0]["containerPort"]
    context = tls_context(cluster)
    cgroup = MemoryCgroup.of(pod)
    limit = cgroup.limit()
    assert limit == 512 * MiB  # the chart's, enforced on this container's cgroup
    before = refusals(port, context, host=host)
    wait_for(  # the webhook has the map: its pods are placed, not refused as unknown
        "the webhook admits the map's pods",
        lambda: (
            cluster.request(
                "POST",
                f"/api/v1/namespaces/{ns}/pods?dryRun=All",
                probe_pod("warm", ns, labels={MAP_LABEL: "llm"}),
            )[0]
            == 201
        ),
        timeout=60,
    )
    resting = cgroup.current()

    with Sampler(cgroup) as sampled, Admissions(cluster, ns, "llm") as admitted:
        flooded = asyncio.run(flood(host, port, context))
    peak = max(cgroup.peak(), sampled.highest)
    after = refusals(port, context, host=host)
    counted = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    print(
        f"\nflood of the webhook pod {host}:{port}: {flooded.bodies_held} of {BODIES} bodies of "
        f"3 MiB held, {flooded.idle_opened} of {IDLE} idle connections opened in "
        f"{flooded.seconds_to_open:.1f} s, held {HOLD_SECONDS:.0f} s"
        f"\nmemory of the container (cgroup), MiB: before {resting / MiB:.0f}, peak "
        f"{peak / MiB:.0f} (kernel's high-water mark {cgroup.peak() / MiB:.0f}), "
        f"limit {limit / MiB:.0f}"
        f"\nrefusals counted: {', '.join(f'{k} {v:.0f}' for k, v in sorted(counted.items()) if v)}"
        f"\nadmissions through the apiserver: {len(admitted.latencies)} answered, "
        f"{len(admitted.refused)} refused; {ms(admitted.latencies)}"
    )

    # (b) Every create during the flood was admitted and mutated by the webhook in time.
    assert admitted.refused == []
    assert len(admitted.latencies) >= 10
    # (a) Under the limit, and the container never restarted (an OOM kill restarts it).
    assert peak < limit
    [status] = webhook_pod(cluster)["status"]["containerStatuses"]
    assert status["restartCount"] == 0, status
    assert status["ready"], status
    # (c) The flood met the caps, and each refusal was counted.
    assert flooded.idle_opened > 512
    for reason in EXPECTED_REFUSALS:
        assert counted.get(reason, 0) > 0, counted
