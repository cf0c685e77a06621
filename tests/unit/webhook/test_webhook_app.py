"""The Flask app through `app.test_client()`: endpoints, 4xx answers, readiness, metrics."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from placement.annotations import MAP_LABEL
from placement.model import Model
from tests.unit.webhook_builders import (
    make_configmap,
    make_model,
    make_pod,
    patched,
    placement_yaml,
    review,
)
from webhook.app import create_app
from webhook.modelcache import StaticModel
from webhook.settings import ServerSettings, WebhookSettings
from webhook.state import state_of

MODEL = make_model().map("llm").obj()


@dataclass
class SwitchableModel:
    model: Model = field(default_factory=Model)
    ready: threading.Event = field(default_factory=threading.Event)

    def current(self) -> Model:
        return self.model

    def loaded(self) -> bool:
        return self.ready.is_set()


@pytest.fixture
def app() -> Flask:
    return create_app(WebhookSettings(), StaticModel(MODEL))


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    return app.test_client()


def post(client: FlaskClient, path: str, body: Any) -> Any:
    return client.post(path, data=json.dumps(body), content_type="application/json")


def metric(app: Flask, name: str, labels: dict[str, str]) -> float:
    value = state_of(app).metrics.registry.get_sample_value(name, labels)
    return value or 0.0


def test_mutate_answers_an_admission_review(client: FlaskClient) -> None:
    pod = make_pod("web-1").label(MAP_LABEL, "llm").obj()
    response = post(client, "/mutate", review(pod, uid="u-7"))
    assert response.status_code == 200
    assert response.mimetype == "application/json"
    body = response.get_json()
    assert body["response"]["uid"] == "u-7"
    assert patched(pod, body)["spec"]["schedulerName"] == "gpuplace"


def test_mutate_denies_with_status(client: FlaskClient) -> None:
    pod = make_pod("web-1").label(MAP_LABEL, "missing").obj()
    body = post(client, "/mutate", review(pod)).get_json()
    assert body["response"]["allowed"] is False
    assert "placement map inference/missing" in body["response"]["status"]["message"]


def test_validate_answers(client: FlaskClient) -> None:
    good = review(make_configmap("llm", placement_yaml()), kind="ConfigMap", resource="configmaps")
    bad = review(make_configmap("llm", "spec: ["), kind="ConfigMap", resource="configmaps")
    assert post(client, "/validate", good).get_json()["response"]["allowed"] is True
    denied = post(client, "/validate", bad).get_json()["response"]
    assert denied["allowed"] is False
    assert "configmap inference/llm placement.yaml:" in denied["status"]["message"]


@pytest.mark.parametrize(
    ("data", "content_type", "status", "says"),
    [
        (b"{not json", "application/json", 400, "not valid JSON"),
        (b"\xff\xfe", "application/json", 400, "not valid JSON"),
        (b"[" * 100_000 + b"]" * 100_000, "application/json", 400, "not valid JSON"),
        (b"1" * 5000, "application/json", 400, "not valid JSON"),
        (b"{}", "text/plain", 415, "Content-Type"),
        (b"", "application/json", 400, "not valid JSON"),
        (b"null", "application/json", 400, "JSON object"),
        (b'{"apiVersion": "v1", "kind": "Pod"}', "application/json", 400, "apiVersion"),
    ],
    ids=["truncated", "not-utf8", "deep-nesting", "huge-integer", "text", "empty", "null", "pod"],
)
def test_malformed_requests_get_4xx_with_a_reason(
    client: FlaskClient, data: bytes, content_type: str, status: int, says: str
) -> None:
    response = client.post("/mutate", data=data, content_type=content_type)
    assert response.status_code == status
    assert says in response.get_json()["reason"]


def test_wrong_kind_for_endpoint_is_422(client: FlaskClient) -> None:
    response = post(client, "/validate", review(make_pod("web-0").obj()))
    assert response.status_code == 422
    assert "/validate admits ConfigMap" in response.get_json()["reason"]


def test_huge_body_is_refused_before_it_is_read() -> None:
    settings = WebhookSettings(server=ServerSettings(max_body_bytes=64 * 1024))
    client = create_app(settings, StaticModel(MODEL)).test_client()
    pod = make_pod("web-0").label(MAP_LABEL, "llm").annotation("big", "x" * 100_000).obj()
    response = post(client, "/mutate", review(pod))
    assert response.status_code == 413
    assert response.get_json()["code"] == 413


def test_unknown_paths_and_methods_are_4xx_json(client: FlaskClient) -> None:
    assert client.get("/nope").status_code == 404
    response = client.get("/mutate")
    assert response.status_code == 405
    assert response.get_json()["code"] == 405


def test_readiness_follows_the_model_cache_and_draining() -> None:
    models = SwitchableModel()
    app = create_app(WebhookSettings(), models)
    client = app.test_client()
    assert client.get("/healthz").status_code == 200
    not_ready = client.get("/readyz")
    assert not_ready.status_code == 503
    assert b"model not loaded yet" in not_ready.data
    models.ready.set()
    assert client.get("/readyz").status_code == 200
    state_of(app).draining.set()
    draining = client.get("/readyz")
    assert draining.status_code == 503
    assert b"shutting down" in draining.data
    assert client.get("/healthz").status_code == 200


def test_metrics_count_decisions_and_latency(app: Flask, client: FlaskClient) -> None:
    post(client, "/mutate", review(make_pod("web-0").label(MAP_LABEL, "llm").obj()))
    post(client, "/mutate", review(make_pod("plain").obj()))
    post(client, "/mutate", review(make_pod("web-0").label(MAP_LABEL, "nope").obj()))
    client.post("/mutate", data=b"{", content_type="application/json")
    for result in ("patched", "allowed", "denied", "malformed"):
        labels = {"operation": "mutate", "result": result}
        assert metric(app, "gpuplace_webhook_decisions_total", labels) == 1.0, result
    count = metric(
        app, "gpuplace_webhook_admission_duration_seconds_count", {"operation": "mutate"}
    )
    assert count == 4.0
    text = client.get("/metrics").get_data(as_text=True)
    assert (
        'gpuplace_webhook_admission_duration_seconds_bucket{le="0.005",operation="mutate"}' in text
    )
    assert "gpuplace_webhook_model_generation 1.0" in text
    assert "gpuplace_webhook_model_maps 1.0" in text
    assert "gpuplace_webhook_model_loaded 1.0" in text


def test_each_app_has_its_own_registry() -> None:
    first = create_app(WebhookSettings(), StaticModel(MODEL))
    second = create_app(WebhookSettings(), StaticModel(MODEL))
    post(first.test_client(), "/mutate", review(make_pod("plain").obj()))
    labels = {"operation": "mutate", "result": "allowed"}
    assert metric(first, "gpuplace_webhook_decisions_total", labels) == 1.0
    assert metric(second, "gpuplace_webhook_decisions_total", labels) == 0.0


def test_model_swaps_are_seen_by_the_next_request() -> None:
    models = SwitchableModel(ready=threading.Event())
    client = create_app(WebhookSettings(), models).test_client()
    pod = make_pod("web-0").label(MAP_LABEL, "llm").obj()
    assert post(client, "/mutate", review(pod)).get_json()["response"]["allowed"] is False
    models.model = MODEL
    assert post(client, "/mutate", review(pod)).get_json()["response"]["allowed"] is True
