"""The Mutating- and ValidatingWebhookConfiguration objects, built without I/O.

`gpuplace webhook --register`, the integration tests and the Helm chart share this shape: the pod
webhook sees only pods labelled `gpuplace.io/map`, the map webhook only ConfigMaps labelled
`gpuplace.io/placement-map=true`, so an outage of the webhook never blocks anyone else's objects.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kubeio.paths import MUTATING_WEBHOOKS, PLACEMENT_MAPS, PLACEMENT_POLICIES, VALIDATING_WEBHOOKS
from placement.annotations import LEGACY_ANNOTATION, MAP_LABEL, PLACEMENT_MAP_LABEL

ADMISSION_API = "admissionregistration.k8s.io/v1"
MUTATING_KIND = "MutatingWebhookConfiguration"
VALIDATING_KIND = "ValidatingWebhookConfiguration"
MUTATING_PATH = MUTATING_WEBHOOKS.collection()
VALIDATING_PATH = VALIDATING_WEBHOOKS.collection()
POD_WEBHOOK = "pods.gpuplace.io"
LEGACY_POD_WEBHOOK = "legacy-pods.gpuplace.io"
MAP_WEBHOOK = "placementmaps.gpuplace.io"
#: The custom resource forms: PlacementMap and the PlacementPolicy.
RESOURCE_WEBHOOK = "placementmap-resources.gpuplace.io"
MUTATE_PATH = "/mutate"
VALIDATE_PATH = "/validate"
#: Pod admission is on every placed pod's path: a short timeout.
TIMEOUT_SECONDS = 5
#: A map is applied rarely and may be up to 1 MiB (tens of thousands of placements): validating it
#: takes seconds, not microseconds, on a busy apiserver host.
MAP_TIMEOUT_SECONDS = 15


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where the apiserver reaches the webhook: a Service (in a cluster) or a URL (local runs)."""

    ca_bundle: bytes = b""
    url: str | None = None  # base, e.g. https://127.0.0.1:8443
    service_namespace: str = ""
    service_name: str = ""
    service_port: int = 443

    def client_config(self, path: str) -> dict[str, Any]:
        config: dict[str, Any]
        if self.url:
            config = {"url": self.url.rstrip("/") + path}
        else:
            config = {
                "service": {
                    "namespace": self.service_namespace,
                    "name": self.service_name,
                    "path": path,
                    "port": self.service_port,
                }
            }
        if self.ca_bundle:
            config["caBundle"] = base64.b64encode(self.ca_bundle).decode()
        return config


def _rule(operations: Sequence[str], resource: str) -> dict[str, Any]:
    return {
        "apiGroups": [""],
        "apiVersions": ["v1"],
        "operations": list(operations),
        "resources": [resource],
        "scope": "Namespaced",
    }


def _common(
    name: str,
    endpoint: Endpoint,
    path: str,
    namespace_selector: dict[str, Any] | None,
    timeout_seconds: int = TIMEOUT_SECONDS,
) -> dict[str, Any]:
    webhook: dict[str, Any] = {
        "name": name,
        "clientConfig": endpoint.client_config(path),
        "failurePolicy": "Fail",
        "sideEffects": "None",
        "timeoutSeconds": timeout_seconds,
        "admissionReviewVersions": ["v1"],
        "matchPolicy": "Equivalent",
    }
    if namespace_selector is not None:
        webhook["namespaceSelector"] = namespace_selector
    return webhook


def legacy_match_conditions(scheduler_names: Sequence[str]) -> list[dict[str, str]]:
    """Legacy pods carry no label an objectSelector could use; CEL conditions, evaluated in the
    apiserver, keep every other pod from reaching the webhook."""
    names = ", ".join(json.dumps(n) for n in scheduler_names)
    return [
        {
            "name": "legacy-annotation",
            "expression": "has(object.metadata.annotations) && "
            f"{json.dumps(LEGACY_ANNOTATION)} in object.metadata.annotations",
        },
        {
            "name": "legacy-scheduler",
            "expression": f"has(object.spec.schedulerName) && object.spec.schedulerName in [{names}]",
        },
    ]


def mutating_configuration(
    name: str,
    endpoint: Endpoint,
    *,
    legacy_scheduler_names: Sequence[str] = (),
    labels: dict[str, str] | None = None,
    namespace_selector: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Pods labelled gpuplace.io/map (and legacy pods, when scheduler names are given)."""
    pods = _common(POD_WEBHOOK, endpoint, MUTATE_PATH, namespace_selector)
    pods["rules"] = [_rule(["CREATE"], "pods")]
    pods["objectSelector"] = {"matchExpressions": [{"key": MAP_LABEL, "operator": "Exists"}]}
    # Containers that a later webhook injects (sidecars) get the env too: we run again, and a
    # pod already wired yields an empty patch.
    pods["reinvocationPolicy"] = "IfNeeded"
    webhooks = [pods]
    if legacy_scheduler_names:
        legacy = _common(LEGACY_POD_WEBHOOK, endpoint, MUTATE_PATH, namespace_selector)
        legacy["rules"] = [_rule(["CREATE"], "pods")]
        # A map's pod is the other entry's: the objectSelector, matched on labels before any
        # condition, spares the apiserver converting each such pod for CEL (as the chart does).
        legacy["objectSelector"] = {
            "matchExpressions": [{"key": MAP_LABEL, "operator": "DoesNotExist"}]
        }
        legacy["matchConditions"] = legacy_match_conditions(legacy_scheduler_names)
        legacy["reinvocationPolicy"] = "IfNeeded"
        webhooks.append(legacy)
    return {
        "apiVersion": ADMISSION_API,
        "kind": MUTATING_KIND,
        "metadata": {"name": name, "labels": dict(labels or {})},
        "webhooks": webhooks,
    }


def validating_configuration(
    name: str,
    endpoint: Endpoint,
    *,
    labels: dict[str, str] | None = None,
    namespace_selector: dict[str, Any] | None = None,
    resources: bool = False,
) -> dict[str, Any]:
    """ConfigMaps labelled gpuplace.io/placement-map=true, on CREATE and UPDATE; with
    `resources`, the PlacementMap and PlacementPolicy custom resources too."""
    maps = _common(MAP_WEBHOOK, endpoint, VALIDATE_PATH, namespace_selector, MAP_TIMEOUT_SECONDS)
    maps["rules"] = [_rule(["CREATE", "UPDATE"], "configmaps")]
    maps["objectSelector"] = {"matchLabels": {PLACEMENT_MAP_LABEL: "true"}}
    webhooks = [maps]
    if resources:
        webhooks.append(_resource_webhook(endpoint, namespace_selector))
    return {
        "apiVersion": ADMISSION_API,
        "kind": VALIDATING_KIND,
        "metadata": {"name": name, "labels": dict(labels or {})},
        "webhooks": webhooks,
    }


def _resource_webhook(
    endpoint: Endpoint, namespace_selector: dict[str, Any] | None
) -> dict[str, Any]:
    """PlacementMap and PlacementPolicy objects whose spec is new (not the controller's status
    writes); the namespace selector does not apply to the cluster-scoped policy."""
    webhook = _common(
        RESOURCE_WEBHOOK, endpoint, VALIDATE_PATH, namespace_selector, MAP_TIMEOUT_SECONDS
    )
    webhook["rules"] = [
        {
            "apiGroups": [PLACEMENT_MAPS.group],
            "apiVersions": [PLACEMENT_MAPS.version],
            "operations": ["CREATE", "UPDATE"],
            "resources": [PLACEMENT_MAPS.plural, PLACEMENT_POLICIES.plural],
            "scope": "*",
        }
    ]
    webhook["matchConditions"] = [
        {
            "name": "spec-may-have-changed",
            "expression": "request.operation == 'CREATE' || object.spec != oldObject.spec",
        }
    ]
    return webhook


def with_ca_bundle(configuration: dict[str, Any], ca_bundle: bytes) -> dict[str, Any] | None:
    """A copy of `configuration` whose webhooks all carry `ca_bundle`; None if they already do."""
    encoded = base64.b64encode(ca_bundle).decode()
    webhooks = configuration.get("webhooks") or []
    if all(w.get("clientConfig", {}).get("caBundle") == encoded for w in webhooks):
        return None
    updated = json.loads(json.dumps(configuration))
    for webhook in updated.get("webhooks") or []:
        webhook.setdefault("clientConfig", {})["caBundle"] = encoded
    return dict(updated)
