"""`gpuplace webhook --processes 2`: the real command, two server processes sharing a port chosen
by the parent (port 0), registered with the real apiserver."""

from __future__ import annotations

import base64
import os
import re
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from gpuplace_dev.localcluster import LocalCluster
from placement.annotations import INDEX_LABEL, MAP_LABEL
from placement.model import Model
from placement.types import MapKey
from tests.integration.test_webhook import (
    compiled,
    create_pod,
    pod,
    register,
    scoped_namespace,
    unregister,
    wait_for,
    wait_webhook_active,
    write_model,
)
from tests.integration.webhookkit import free_port
from webhook.certs import KeyPair, generate_ca, issue_serving
from webhook.tlsbootstrap import issued_by

CONFIGURATION = "gpuplace-webhook-procs-it"
MODEL_NAMESPACE = "gpuplace-webhook-procs-model"
SERVING = re.compile(r"serving HTTPS on 127\.0\.0\.1:(\d+) from processes \[(\d+), (\d+)\]")


@dataclass
class Command:
    proc: subprocess.Popen[bytes]
    log: Path
    port: int
    ca: KeyPair
    workers: tuple[int, int]

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def get(self, path: str) -> tuple[int, str]:
        context = ssl.create_default_context(cadata=self.ca.cert_pem.decode())
        try:
            with urllib.request.urlopen(
                f"https://127.0.0.1:{self.port}{path}", context=context, timeout=10
            ) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def ready(self) -> bool:
        try:
            return self.get("/readyz")[0] == 200
        except OSError:
            return False


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def metric_values(text: str, name: str) -> dict[str, float]:
    """`name`'s samples by their label text."""
    pattern = re.compile(rf"^{name}(\{{[^}}]*\}})? ([0-9.e+]+)$", re.MULTILINE)
    return {labels or "": float(value) for labels, value in pattern.findall(text)}


def start_command(cluster: LocalCluster, tmp: Path) -> Command:
    """`gpuplace webhook --processes 2 --port 0` with mounted TLS; returns once both serve."""
    ca = generate_ca("webhook-procs-it-ca", timedelta(days=2))
    pair = issue_serving(ca, ["localhost"], ["127.0.0.1"], timedelta(days=1))
    (tmp / "tls.crt").write_bytes(pair.cert_pem)
    (tmp / "tls.key").write_bytes(pair.key_pem)
    log = tmp / "webhook.log"
    argv = [
        sys.executable, "-m", "gpuplace", "webhook", "--kubeconfig", str(cluster.kubeconfig),
        "--namespace", MODEL_NAMESPACE, "--host", "127.0.0.1", "--port", "0",
        "--processes", "2", "--shutdown-delay-seconds", "0",
        "--tls-cert-file", str(tmp / "tls.crt"), "--tls-key-file", str(tmp / "tls.key"),
    ]  # fmt: skip
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        found = wait_for(
            "the parent to start its processes", lambda: SERVING.search(log.read_text())
        )
        port, first, second = (int(g) for g in found.groups())
        running = Command(proc, log, port, ca, (first, second))
        wait_for("both processes to be ready", lambda: "2 processes ready" in running.text())
    except BaseException:
        proc.kill()
        proc.wait(30)
        raise
    return running


@pytest.fixture(scope="module")
def command(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Command]:
    cluster.create_namespace(MODEL_NAMESPACE)
    running = start_command(cluster, tmp_path_factory.mktemp("webhook-procs"))
    proc = running.proc
    try:
        register(
            cluster, f"https://127.0.0.1:{running.port}", running.ca.cert_pem, name=CONFIGURATION
        )
        yield running
    finally:
        unregister(cluster, CONFIGURATION)
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


@pytest.fixture
def ns(cluster: LocalCluster, command: Command) -> Iterator[str]:
    name = scoped_namespace(cluster)
    model = Model(int(time.time() * 1000), {MapKey(name, "llm"): compiled(name, "llm", range(4))})
    write_model(cluster, model, MODEL_NAMESPACE)
    wait_webhook_active(cluster, name, "llm")
    yield name
    cluster.delete_namespace(name)


def test_a_burst_is_answered_by_both_processes_and_counted_once(
    cluster: LocalCluster, ns: str, command: Command
) -> None:
    count = 160
    decisions = "gpuplace_webhook_decisions_total"
    before = sum(metric_values(command.get("/metrics")[1], decisions).values())

    def create(i: int) -> tuple[int, dict[str, Any]]:
        labels = {MAP_LABEL: "llm", INDEX_LABEL: str(i % 4)}
        return create_pod(cluster, pod(f"burst-{i}", ns, labels=labels), dry_run=True)

    with ThreadPoolExecutor(16) as threads:
        results = list(threads.map(create, range(count)))
    assert [status for status, _ in results] == [201] * count, results[:3]
    assert all(body["spec"]["schedulerName"] == "gpuplace" for _, body in results)
    assert all(body["spec"]["containers"][0]["env"] for _, body in results)

    text = command.get("/metrics")[1]
    total = sum(metric_values(text, decisions).values())
    assert total - before == count
    per_process = metric_values(text, "gpuplace_webhook_process_reviews")
    by_pid = {int(re.sub(r"\D", "", labels)): v for labels, v in per_process.items()}
    assert set(by_pid) == set(command.workers)
    assert all(served > 0 for served in by_pid.values()), by_pid
    assert sum(by_pid.values()) == total
    # Every scrape, whichever process answers it, reads the same totals.
    assert sum(metric_values(command.get("/metrics")[1], decisions).values()) == total


def test_a_killed_process_is_replaced_and_sigterm_stops_them_all(command: Command) -> None:
    victim = command.workers[0]
    os.kill(victim, signal.SIGKILL)

    def started() -> list[int]:
        return [
            int(pid)
            for pid in re.findall(r"started webhook process 0 \(pid (\d+)\)", command.text())
        ]

    # The parent logs "restarting" and then, after its back-off, the new process's pid.
    wait_for("the parent to restart the process", lambda: started()[-1] != victim)
    assert f"webhook process 0 (pid {victim}) exited" in command.text()
    replacement = started()[-1]
    wait_for("the replacement to serve", lambda: alive(replacement) and command.ready())

    command.proc.send_signal(signal.SIGTERM)
    assert command.proc.wait(60) == 0, command.text()[-2000:]
    for pid in (replacement, command.workers[1]):
        assert not alive(pid), pid


def test_the_processes_stop_when_the_parent_dies(cluster: LocalCluster, tmp_path: Path) -> None:
    running = start_command(cluster, tmp_path)
    running.proc.kill()
    running.proc.wait(30)
    wait_for("the orphaned processes to exit", lambda: not any(map(alive, running.workers)))


def test_bootstrapped_tls_is_issued_once_and_served_by_every_process(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    namespace = f"webhook-procs-boot-{uuid.uuid4().hex[:6]}"
    configuration = f"gpuplace-procs-boot-{uuid.uuid4().hex[:6]}"
    cluster.create_namespace(namespace)
    port = free_port()
    log = tmp_path / "webhook.log"
    argv = [
        sys.executable, "-m", "gpuplace", "webhook", f"--kubeconfig={cluster.kubeconfig}",
        f"--namespace={namespace}", f"--configuration-name={configuration}", "--bootstrap-tls",
        "--host=127.0.0.1", f"--port={port}", f"--register=https://127.0.0.1:{port}",
        "--processes=2", "--shutdown-delay-seconds=0",
    ]  # fmt: skip
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for("the configurations", lambda: "registered" in log.read_text(), 60)
        text = log.read_text()
        assert text.count("cannot read or create the CA Secret") == 0
        workers = [int(p) for p in re.findall(r"started webhook process \d \(pid (\d+)\)", text)]
        status, secret = cluster.request(
            "GET", f"/api/v1/namespaces/{namespace}/secrets/gpuplace-webhook-ca"
        )
        assert status == 200, secret
        ca = KeyPair(base64.b64decode(secret["data"]["tls.crt"]), b"")
        # Each handshake lands on either process: all serve the parent's certificate.
        served = {ssl.get_server_certificate(("127.0.0.1", port)) for _ in range(8)}
        assert len(served) == 1
        assert issued_by(KeyPair(served.pop().encode(), b""), ca)
        # The apiserver trusts the registered bundle and reaches a process.
        status, body = create_pod(cluster, pod("web-0", namespace, labels={MAP_LABEL: "llm"}))
        assert status == 403, body
        assert f"placement map {namespace}/llm, which does not exist" in body["message"]

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log.read_text()[-2000:]
        assert len(workers) == 2
        assert not [pid for pid in workers if alive(pid)]
    finally:
        # Registered without a namespace selector (failurePolicy Fail): deleted before the
        # processes go, and again after (the parent registers once its processes serve).
        unregister(cluster, configuration)
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        unregister(cluster, configuration)
        cluster.delete_namespace(namespace)
