"""The webhook behind the real apiserver for the custom resource forms: a PlacementMap whose schema
is fine but whose content is not is refused naming the object and the field path; status writes
never reach the webhook (the configuration's match condition)."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from datetime import timedelta

import pytest

from gpuplace_dev.localcluster import LocalCluster
from kubeio.client import ClientSettings, Kube
from kubeio.paths import PLACEMENT_MAPS
from tests.integration.controllerkit import map_yaml, wait_for
from tests.integration.webhookkit import RunningWebhook, free_port
from webhook.certs import generate_ca
from webhook.manifests import VALIDATING_PATH, Endpoint, validating_configuration
from webhook.modelcache import ModelCache
from webhook.register import apply_configuration

pytestmark = pytest.mark.integration

SCOPE_LABEL = "gpuplace.io/webhook-resources-it"
CONFIGURATION = "gpuplace-webhook-resources-it"
MODEL_NAMESPACE = "gpuplace-webhook-resources-it-model"


def validations(webhook: RunningWebhook) -> float:
    """How many map reviews the webhook has answered, from its /metrics."""
    status, text = webhook.get("/metrics")
    assert status == 200
    pattern = r'gpuplace_webhook_decisions_total\{operation="validate",result="\w+"\} ([0-9.]+)'
    return sum(float(v) for v in re.findall(pattern, text))


@pytest.fixture(scope="module")
def webhook(cluster: LocalCluster) -> Iterator[RunningWebhook]:
    cluster.create_namespace(MODEL_NAMESPACE)
    kube = Kube.connect(ClientSettings(kubeconfig=str(cluster.kubeconfig)))
    models = ModelCache(kube, MODEL_NAMESPACE).start()
    running = RunningWebhook(
        cluster, generate_ca("webhook-resources-ca", timedelta(days=2)), models, port=free_port()
    )
    running.start()
    try:
        endpoint = Endpoint(ca_bundle=running.ca.cert_pem, url=f"https://127.0.0.1:{running.port}")
        selector = {"matchLabels": {SCOPE_LABEL: "true"}}
        apply_configuration(
            kube,
            validating_configuration(
                CONFIGURATION, endpoint, namespace_selector=selector, resources=True
            ),
        )
        yield running
    finally:
        cluster.request("DELETE", f"{VALIDATING_PATH}/{CONFIGURATION}")
        running.stop()
        models.stop()


@pytest.fixture
def ns(cluster: LocalCluster, webhook: RunningWebhook) -> Iterator[str]:
    name = f"webhook-res-{uuid.uuid4().hex[:6]}"
    cluster.create_namespace(name, labels={SCOPE_LABEL: "true"})
    try:
        yield name
    finally:
        cluster.delete_namespace(name)


def test_a_semantic_error_is_refused_by_the_webhook_naming_the_field_path(
    cluster: LocalCluster, ns: str, webhook: RunningWebhook
) -> None:
    broken = map_yaml(ns, "llm", [(0, "gpu-a-01", [0, 0])])

    def refused() -> str | None:
        result = cluster.kubectl("apply", "-f", "-", input=broken, check=False)
        return result.stderr if result.returncode != 0 else None

    # The apiserver picks the configuration up asynchronously.
    stderr = wait_for("the webhook to refuse the map", refused)
    assert 'admission webhook "placementmap-resources.gpuplace.io" denied the request' in stderr
    assert f"placementmap {ns}/llm: error: spec.placements[0].devices[1]" in stderr
    assert "listed twice" in stderr
    status, _ = cluster.request("GET", PLACEMENT_MAPS.item("llm", ns))
    assert status == 404  # nothing half-applied


def test_status_writes_do_not_reach_the_webhook(
    cluster: LocalCluster, ns: str, webhook: RunningWebhook
) -> None:
    good = map_yaml(ns, "llm", [(0, "gpu-a-01", [0, 1])])
    wait_for(
        "the map admitted",
        lambda: cluster.kubectl("apply", "-f", "-", input=good, check=False).returncode == 0,
    )
    before = validations(webhook)
    patch = {"status": {"phase": "Valid", "message": "written by a test"}}
    status, body = cluster.request("PATCH", PLACEMENT_MAPS.item("llm", ns, "status"), patch)
    assert status == 200, body
    labelled = {"metadata": {"labels": {"team": "a"}}}
    status, body = cluster.request("PATCH", PLACEMENT_MAPS.item("llm", ns), labelled)
    assert status == 200, body
    assert validations(webhook) == before
    # A new spec is reviewed.
    moved = {"spec": {"placements": [{"index": 0, "node": "gpu-a-02", "devices": [3]}]}}
    status, body = cluster.request("PATCH", PLACEMENT_MAPS.item("llm", ns), moved)
    assert status == 200, body
    assert validations(webhook) == before + 1
