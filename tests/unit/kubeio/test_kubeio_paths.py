"""kubeio.paths: every resource's collection and item paths, scope checks and escaping."""

from __future__ import annotations

import pytest

from kubeio.paths import (
    CONFIGMAPS,
    EVENTS,
    LEASES,
    MUTATING_WEBHOOKS,
    NODES,
    PODS,
    RESOURCE_CLAIM_TEMPLATES,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    SECRETS,
    VALIDATING_WEBHOOKS,
    Resource,
)

NAMESPACED = [
    (PODS, "/api/v1/pods", "/api/v1/namespaces/ml/pods"),
    (CONFIGMAPS, "/api/v1/configmaps", "/api/v1/namespaces/ml/configmaps"),
    (SECRETS, "/api/v1/secrets", "/api/v1/namespaces/ml/secrets"),
    (EVENTS, "/api/v1/events", "/api/v1/namespaces/ml/events"),
    (
        LEASES,
        "/apis/coordination.k8s.io/v1/leases",
        "/apis/coordination.k8s.io/v1/namespaces/ml/leases",
    ),
    (
        RESOURCE_CLAIMS,
        "/apis/resource.k8s.io/v1/resourceclaims",
        "/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims",
    ),
    (
        RESOURCE_CLAIM_TEMPLATES,
        "/apis/resource.k8s.io/v1/resourceclaimtemplates",
        "/apis/resource.k8s.io/v1/namespaces/ml/resourceclaimtemplates",
    ),
]
CLUSTER = [
    (NODES, "/api/v1/nodes"),
    (RESOURCE_SLICES, "/apis/resource.k8s.io/v1/resourceslices"),
    (MUTATING_WEBHOOKS, "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"),
    (
        VALIDATING_WEBHOOKS,
        "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
    ),
]


@pytest.mark.parametrize(("resource", "everywhere", "in_ml"), NAMESPACED)
def test_namespaced_resources(resource: Resource, everywhere: str, in_ml: str) -> None:
    assert resource.collection() == everywhere
    assert resource.collection("ml") == in_ml
    assert resource.item("x", "ml") == f"{in_ml}/x"
    with pytest.raises(ValueError, match="needs a namespace"):
        resource.item("x")


@pytest.mark.parametrize(("resource", "path"), CLUSTER)
def test_cluster_scoped_resources(resource: Resource, path: str) -> None:
    assert resource.collection() == path
    assert resource.item("x") == f"{path}/x"
    with pytest.raises(ValueError, match="cluster-scoped"):
        resource.collection("ml")


@pytest.mark.parametrize("subresource", ["binding", "status", "eviction"])
def test_pod_subresources(subresource: str) -> None:
    assert (
        PODS.item("web-0", "ml", subresource) == f"/api/v1/namespaces/ml/pods/web-0/{subresource}"
    )


@pytest.mark.parametrize("name", ["a/b", "a?b", "a b", "a%2F", "../x"])
def test_what_goes_into_a_path_is_escaped(name: str) -> None:
    path = PODS.item(name, "ml")
    tail = path.removeprefix("/api/v1/namespaces/ml/pods/")
    assert "/" not in tail and "?" not in tail and " " not in tail
    assert CONFIGMAPS.collection(name).count("/") == 5


@pytest.mark.parametrize("bad", ["", ".", ".."])
def test_an_empty_or_dot_name_or_namespace_has_no_path(bad: str) -> None:
    with pytest.raises(ValueError, match="no path"):
        PODS.item(bad, "ml")
    with pytest.raises(ValueError, match="no path"):
        PODS.collection(bad)
