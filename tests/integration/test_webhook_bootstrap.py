"""`gpuplace webhook --bootstrap-tls --register URL` as real processes against the real apiserver:
a CA shared through a Secret (create-or-get), the caBundle written and kept, graceful SIGTERM."""

from __future__ import annotations

import base64
import os
import signal
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gpuplace_dev.localcluster import LocalCluster
from kubeio.client import ClientSettings, Kube
from placement.annotations import MAP_LABEL
from tests.integration.test_webhook import create_pod, free_port, pod, wait_for
from webhook.certs import KeyPair, split_bundle
from webhook.manifests import (
    MUTATING_PATH,
    VALIDATING_PATH,
    Endpoint,
    mutating_configuration,
    validating_configuration,
)
from webhook.register import apply_configuration
from webhook.settings import RegistrationSettings, TLSSettings
from webhook.tls import ServingTLS
from webhook.tlsbootstrap import BUNDLE_KEY, CA_CERT_KEY, TLSBootstrap, issued_by

SECRET = "gpuplace-webhook-ca"


class Replica:
    def __init__(
        self, cluster: LocalCluster, namespace: str, configuration: str, log: Path
    ) -> None:
        self.port = free_port()
        self.log = log
        self._out = log.open("w")
        self.process = subprocess.Popen(
            [
                sys.executable, "-m", "gpuplace", "webhook",
                f"--kubeconfig={cluster.kubeconfig}",
                f"--namespace={namespace}",
                f"--configuration-name={configuration}",
                "--bootstrap-tls",
                "--host=127.0.0.1",
                f"--port={self.port}",
                f"--register=https://127.0.0.1:{self.port}",
                "--shutdown-delay-seconds=0.2",
            ],
            stdout=self._out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip

    def get(self, path: str, trust: bytes) -> tuple[int, bytes]:
        context = ssl.create_default_context(cadata=trust.decode())
        try:
            url = f"https://127.0.0.1:{self.port}{path}"
            with urllib.request.urlopen(url, context=context, timeout=5) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()
        except (urllib.error.URLError, OSError):
            return 0, b""

    def served_certificate(self) -> bytes:
        return ssl.get_server_certificate(("127.0.0.1", self.port)).encode()

    def terminate(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(30)
        finally:
            self._out.close()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self._out.close()


def secret_data(cluster: LocalCluster, namespace: str) -> dict[str, bytes] | None:
    status, body = cluster.request("GET", f"/api/v1/namespaces/{namespace}/secrets/{SECRET}")
    if status != 200:
        return None
    return {k: base64.b64decode(v) for k, v in body["data"].items()}


def bundles(cluster: LocalCluster, configuration: str) -> set[str]:
    found: set[str] = set()
    for collection in (MUTATING_PATH, VALIDATING_PATH):
        status, body = cluster.request("GET", f"{collection}/{configuration}")
        if status != 200:
            return {"<missing>"}
        found |= {w["clientConfig"].get("caBundle", "") for w in body["webhooks"]}
    return found


@pytest.fixture
def setup(cluster: LocalCluster, tmp_path: Path) -> Iterator[tuple[str, str, list[Replica]]]:
    namespace = f"webhook-boot-{uuid.uuid4().hex[:6]}"
    configuration = f"gpuplace-boot-{uuid.uuid4().hex[:6]}"
    cluster.create_namespace(namespace)
    replicas: list[Replica] = []
    try:
        yield namespace, configuration, replicas
    finally:
        # Its configurations send every labelled pod of the cluster here (failurePolicy Fail):
        # deleted before the replicas go, and again after (a replica registers as it starts).
        unregister(cluster, configuration)
        for replica in replicas:
            replica.kill()
        unregister(cluster, configuration)
        cluster.delete_namespace(namespace)


def unregister(cluster: LocalCluster, configuration: str) -> None:
    for collection in (MUTATING_PATH, VALIDATING_PATH):
        cluster.request("DELETE", f"{collection}/{configuration}")


def test_bootstrap_shares_the_ca_and_keeps_the_ca_bundle(
    cluster: LocalCluster, tmp_path: Path, setup: tuple[str, str, list[Replica]]
) -> None:
    namespace, configuration, replicas = setup
    first = Replica(cluster, namespace, configuration, tmp_path / "first.log")
    replicas.append(first)
    data = wait_for("the CA Secret", lambda: secret_data(cluster, namespace), timeout=60)
    ca = KeyPair(data[CA_CERT_KEY], data["tls.key"])
    wait_for(
        f"first replica ready ({first.log})",
        lambda: first.get("/readyz", data[BUNDLE_KEY])[0] == 200,
        60,
    )
    expected = {base64.b64encode(data[BUNDLE_KEY]).decode()}
    wait_for("the caBundle", lambda: bundles(cluster, configuration) == expected)

    second = Replica(cluster, namespace, configuration, tmp_path / "second.log")
    replicas.append(second)
    wait_for(
        f"second replica ready ({second.log})",
        lambda: second.get("/readyz", data[BUNDLE_KEY])[0] == 200,
        60,
    )
    assert secret_data(cluster, namespace) == data  # got, not created again
    for replica in (first, second):
        assert issued_by(KeyPair(replica.served_certificate(), b""), ca)

    # The apiserver now calls the second replica (it registered last), trusting the shared CA.
    status, body = create_pod(cluster, pod("web-0", namespace, labels={MAP_LABEL: "llm"}))
    assert status == 403, body
    assert f"placement map {namespace}/llm, which does not exist" in body["message"]

    # Something (a Helm upgrade) resets the caBundle: the replicas' watch writes it back.
    status, config = cluster.request("GET", f"{MUTATING_PATH}/{configuration}")
    assert status == 200
    for webhook in config["webhooks"]:
        webhook["clientConfig"].pop("caBundle", None)
    status, body = cluster.request("PUT", f"{MUTATING_PATH}/{configuration}", config)
    assert status == 200, body
    wait_for("the caBundle to be written back", lambda: bundles(cluster, configuration) == expected)

    for replica in (first, second):
        assert replica.terminate() == 0, replica.log.read_text()
        assert "stopped" in replica.log.read_text()


def test_without_tls_the_command_refuses_to_start(cluster: LocalCluster) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gpuplace", "webhook", f"--kubeconfig={cluster.kubeconfig}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "serves TLS only" in result.stderr


def test_rotation_reissues_from_a_new_ca_and_keeps_the_old_one_trusted(
    cluster: LocalCluster, setup: tuple[str, str, list[Replica]]
) -> None:
    namespace, configuration, _ = setup
    kube = Kube.connect(ClientSettings(kubeconfig=str(cluster.kubeconfig)))
    endpoint = Endpoint(url="https://127.0.0.1:1")  # never called: no namespace matches
    selector = {"matchLabels": {"gpuplace.io/never": "true"}}
    apply_configuration(
        kube, mutating_configuration(configuration, endpoint, namespace_selector=selector)
    )
    apply_configuration(
        kube, validating_configuration(configuration, endpoint, namespace_selector=selector)
    )
    now = [datetime.now(UTC)]
    tls = TLSSettings(namespace=namespace, ca_validity_days=30, cert_validity_days=3)
    boot = TLSBootstrap(kube, tls, RegistrationSettings(configuration), clock=lambda: now[0])
    serving = ServingTLS(boot.issue())
    try:
        boot.start(serving)
        before = secret_data(cluster, namespace)
        assert before is not None
        old_ca = KeyPair(before[CA_CERT_KEY], before["tls.key"])
        old_bundle = {base64.b64encode(before[BUNDLE_KEY]).decode()}
        wait_for("the caBundle", lambda: bundles(cluster, configuration) == old_bundle)

        # Past 2/3 of the serving certificate's life: a new one from the same CA.
        first_pair = serving.pair
        now[0] += timedelta(days=2, hours=1)
        boot.reconcile()
        assert serving.pair != first_pair
        assert issued_by(serving.pair, old_ca)
        assert secret_data(cluster, namespace) == before

        # Past 2/3 of the CA's life: a new CA, the bundle trusts both, the server uses the new one.
        now[0] += timedelta(days=19)
        boot.reconcile()
        after = secret_data(cluster, namespace)
        assert after is not None and after[CA_CERT_KEY] != before[CA_CERT_KEY]
        new_ca = KeyPair(after[CA_CERT_KEY], after["tls.key"])
        assert issued_by(serving.pair, new_ca)
        trusted = {c.subject for c in split_bundle(after[BUNDLE_KEY])}
        assert trusted == {old_ca.certificate().subject, new_ca.certificate().subject}
        assert bundles(cluster, configuration) == {base64.b64encode(after[BUNDLE_KEY]).decode()}
    finally:
        boot.stop()
        serving.close()
