"""The training operators' launcher (gpuplace_dev.localtraining): their webhook configurations
pointed at the manager on loopback, and the releases hack/training-operators/go.mod pins."""

from __future__ import annotations

import base64
from typing import Any

from gpuplace_dev.localtraining.binaries import versions
from gpuplace_dev.localtraining.launcher import loopback_webhooks

SHIPPED: dict[str, Any] = {
    "apiVersion": "admissionregistration.k8s.io/v1",
    "kind": "MutatingWebhookConfiguration",
    "metadata": {"name": "mutating-webhook-configuration"},
    "webhooks": [
        {
            "name": "mpod.kb.io",
            "clientConfig": {
                "service": {
                    "name": "webhook-service",
                    "namespace": "system",
                    "path": "/mutate--v1-pod",
                }
            },
            "objectSelector": {
                "matchExpressions": [
                    {"key": "leaderworkerset.sigs.k8s.io/name", "operator": "Exists"}
                ]
            },
        }
    ],
}


def test_each_webhook_calls_the_manager_on_loopback_and_keeps_its_selector() -> None:
    out = loopback_webhooks(SHIPPED, "lws", 9443, b"CA")
    assert out["metadata"] == {"name": "lws-mutating-webhook-configuration"}
    (hook,) = out["webhooks"]
    assert hook["clientConfig"] == {
        "url": "https://127.0.0.1:9443/mutate--v1-pod",
        "caBundle": base64.b64encode(b"CA").decode(),
    }
    assert hook["objectSelector"] == SHIPPED["webhooks"][0]["objectSelector"]
    assert SHIPPED["webhooks"][0]["clientConfig"]["service"]["path"] == "/mutate--v1-pod"


def test_the_pinned_releases_are_read_from_the_go_module() -> None:
    jobset, lws = versions()
    assert jobset.startswith("v") and lws.startswith("v")
