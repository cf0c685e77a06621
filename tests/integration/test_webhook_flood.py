"""No client holds the webhook's port: the real webhook (over HTTPS, its default bounds)
registered with the real apiserver, while clients that are not the apiserver hold hundreds of
kept-alive TLS connections, each having answered a GET /healthz, and keep opening more.

The flood comes from other loopback addresses (127.0.0.2, ...), as a tenant's pod has an address
of its own; the apiserver calls from 127.0.0.1, and so do the probes, as the kubelet calls from
the node. Nothing is timed: every fresh probe and every admission must be answered with success
within the client's timeout, 3 s, as the kubelet's probe and the acceptance ask.
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest

from gpuplace_dev.localcluster import LocalCluster
from kubeio.client import ClientSettings, Kube
from placement.annotations import INDEX_LABEL, MAP_LABEL
from placement.model import Model
from placement.types import MapKey
from tests.integration.test_webhook import compiled, create_pod, pod, wait_for, write_model
from tests.integration.webhookkit import RunningWebhook, free_port
from webhook.certs import generate_ca
from webhook.manifests import (
    MUTATING_PATH,
    VALIDATING_PATH,
    Endpoint,
    mutating_configuration,
    validating_configuration,
)
from webhook.modelcache import ModelCache
from webhook.register import apply_configuration
from webhook.settings import DEFAULT_MAX_CONNECTIONS

SCOPE_LABEL = "gpuplace.io/webhook-flood-it"
CONFIGURATION = "gpuplace-webhook-flood-it"
MODEL_NAMESPACE = "gpuplace-webhook-flood-it-model"
#: The kubelet's probe and the acceptance's bound on an answer.
CLIENT_TIMEOUT = 3.0
HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: webhook\r\n\r\n"


@pytest.fixture(scope="module")
def webhook(cluster: LocalCluster) -> Iterator[RunningWebhook]:
    cluster.create_namespace(MODEL_NAMESPACE)
    kube = Kube.connect(ClientSettings(kubeconfig=str(cluster.kubeconfig)))
    models = ModelCache(kube, MODEL_NAMESPACE).start()
    running = RunningWebhook(
        cluster, generate_ca("webhook-flood-it-ca", timedelta(days=2)), models, port=free_port()
    )
    running.start()
    endpoint = Endpoint(ca_bundle=running.ca.cert_pem, url=f"https://127.0.0.1:{running.port}")
    selector = {"matchLabels": {SCOPE_LABEL: "true"}}
    try:
        apply_configuration(
            kube, mutating_configuration(CONFIGURATION, endpoint, namespace_selector=selector)
        )
        apply_configuration(
            kube, validating_configuration(CONFIGURATION, endpoint, namespace_selector=selector)
        )
        yield running
    finally:
        for collection in (MUTATING_PATH, VALIDATING_PATH):
            cluster.request("DELETE", f"{collection}/{CONFIGURATION}")
        running.stop()
        models.stop()


@pytest.fixture
def ns(cluster: LocalCluster, webhook: RunningWebhook) -> Iterator[str]:
    name = f"webhook-flood-it-{uuid.uuid4().hex[:6]}"
    cluster.create_namespace(name, labels={SCOPE_LABEL: "true"})
    write_model(
        cluster,
        Model(int(time.time() * 1000), {MapKey(name, "llm"): compiled(name, "llm", range(4))}),
        MODEL_NAMESPACE,
    )

    def mutated() -> bool:
        probe = pod(f"probe-{uuid.uuid4().hex[:6]}", name, labels={MAP_LABEL: "llm"})
        status, body = create_pod(cluster, probe, dry_run=True)
        return status == 201 and body["spec"].get("schedulerName") == "gpuplace"

    wait_for("the apiserver to call the webhook", mutated)
    yield name
    cluster.delete_namespace(name)


class Flood:
    """Kept-alive TLS connections from `clients` (loopback addresses), each having sent a
    GET /healthz and read its answer, then held open; `renew` keeps opening more, as the tenant
    of the report did, until `stop`."""

    def __init__(self, webhook: RunningWebhook, clients: list[str]) -> None:
        self._port = webhook.port
        self._context = ssl.create_default_context(cadata=webhook.ca.cert_pem.decode())
        self._clients = clients
        self._lock = threading.Lock()
        self.held: list[ssl.SSLSocket] = []
        self.opened = 0  # connections that had their /healthz answered
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    def open_one(self, client: str) -> None:
        raw = socket.create_connection(
            ("127.0.0.1", self._port), timeout=30, source_address=(client, 0)
        )
        try:
            sock = self._context.wrap_socket(raw, server_hostname="127.0.0.1")
            sock.sendall(HEALTHZ)
            answer = b""
            while not answer.endswith(b"ok\n"):  # /healthz answers "ok\n"
                chunk = sock.recv(4096)
                if not chunk:
                    raise ConnectionError("closed before answering")
                answer += chunk
        except OSError:
            raw.close()
            return  # closed to make room for a newer one of ours: the flood goes on
        with self._lock:
            self.held.append(sock)
            self.opened += 1

    def fill(self, per_client: int) -> None:
        with ThreadPoolExecutor(16) as threads:
            for client in self._clients:
                list(threads.map(self.open_one, [client] * per_client))

    def renew(self) -> None:
        def run() -> None:
            n = 0
            while not self._stop.is_set():
                self.open_one(self._clients[n % len(self._clients)])
                n += 1

        self._renewer = threading.Thread(target=run, name="flood-renewer", daemon=True)
        self._renewer.start()

    def stop(self) -> None:
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join(30)
        with self._lock:
            for sock in self.held:
                sock.close()


def probe(webhook: RunningWebhook) -> bytes:
    """A kubelet's probe: a fresh connection, GET /healthz, the whole answer, within 3 s."""
    context = ssl.create_default_context(cadata=webhook.ca.cert_pem.decode())
    raw = socket.create_connection(("127.0.0.1", webhook.port), timeout=CLIENT_TIMEOUT)
    with context.wrap_socket(raw, server_hostname="127.0.0.1") as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: webhook\r\nConnection: close\r\n\r\n")
        answer = b""
        while chunk := sock.recv(4096):
            answer += chunk
    return answer


def refused(webhook: RunningWebhook, reason: str) -> float:
    status, text = webhook.get("/metrics")
    assert status == 200
    for line in text.splitlines():
        if line.startswith(f'gpuplace_webhook_refused_total{{reason="{reason}"}} '):
            return float(line.split()[-1])
    return 0.0


@pytest.mark.parametrize(
    ("clients", "each"),
    [(["127.0.0.2"], 700), (["127.0.0.2", "127.0.0.3", "127.0.0.4"], 350)],
    ids=["one-tenant", "three-tenants"],
)
def test_a_keep_alive_flood_leaves_every_probe_and_admission_answered(
    cluster: LocalCluster, ns: str, webhook: RunningWebhook, clients: list[str], each: int
) -> None:
    assert webhook.server is not None
    flood = Flood(webhook, clients)
    try:
        # One tenant: 700 connections (the report's) against its share of 256. Three: 1,050
        # against the port's 512, which they fill.
        flood.fill(per_client=each)
        held = min(DEFAULT_MAX_CONNECTIONS, len(clients) * DEFAULT_MAX_CONNECTIONS // 2)
        wait_for("the flood to hold its share", lambda: webhook.server.connections >= held)
        assert refused(webhook, "evicted") > 0
        flood.renew()

        probes: list[Any] = []
        admissions: list[Any] = []

        def admit(i: int) -> tuple[int, dict[str, Any]]:
            labels = {MAP_LABEL: "llm", INDEX_LABEL: str(i % 4)}
            return create_pod(cluster, pod(f"flooded-{i}", ns, labels=labels), dry_run=True)

        with ThreadPoolExecutor(4) as threads:
            for round_ in range(30):
                probes.append(probe(webhook))
                admissions.extend(threads.map(admit, range(4 * round_, 4 * round_ + 4)))
        flood_opened = flood.opened
    finally:
        flood.stop()

    failed = [p[:80] for p in probes if not p.startswith(b"HTTP/1.1 200 ")]
    assert not failed, f"{len(failed)} of {len(probes)} probes failed: {failed[:3]}"
    bad = [(status, body.get("message")) for status, body in admissions if status != 201]
    assert not bad, f"{len(bad)} of {len(admissions)} admissions failed: {bad[:3]}"
    assert all(body["spec"]["schedulerName"] == "gpuplace" for _, body in admissions)
    assert flood_opened > len(clients) * each  # the flood went on while it was probed
    assert webhook.server.peak_connections <= DEFAULT_MAX_CONNECTIONS
    assert refused(webhook, "connections") == 0
