"""charts/gpuplace and the custom resources: the CRDs in crds/ (or, with crds.managed, rendered and
kept on uninstall), the controller's rights on them, the webhook for them, and what
maps.configMaps.enabled=false takes away."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from placement.crd import all_crds
from tests.chartkit import CHART, NAMESPACE, Scenario, find, one, render
from tests.unit.chart.test_chart import container, grants, rules_of

MANAGED = Scenario("crds-managed", {"crds": {"managed": True}})
NO_CONFIGMAPS = Scenario("configmap-maps-off", {"maps": {"configMaps": {"enabled": False}}})


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    tmp = tmp_path_factory.mktemp("values")
    return {s.name: render(s, tmp) for s in (Scenario("default"), MANAGED, NO_CONFIGMAPS)}


def webhooks(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    config = one(objects, "ValidatingWebhookConfiguration", "gpuplace")
    return {h["name"]: h for h in config["webhooks"]}


def test_crds_directory_holds_the_generated_crds() -> None:
    files = sorted((CHART / "crds").glob("*.yaml"))
    assert [p.name for p in files] == [
        "placementmaps.gpuplace.io.yaml",
        "placementpolicies.gpuplace.io.yaml",
    ]
    assert [yaml.safe_load(p.read_text()) for p in files] == list(all_crds())


def test_templates_render_no_crd_unless_managed(
    rendered: dict[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    assert find(rendered["default"], "CustomResourceDefinition") == []
    # `helm template --include-crds` (what ArgoCD renders) adds crds/ as they are.
    included = render(Scenario("default"), tmp_path, "--include-crds")
    assert find(included, "CustomResourceDefinition") == list(all_crds())


def test_managed_crds_are_the_same_crds_kept_on_uninstall(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    crds = find(rendered[MANAGED.name], "CustomResourceDefinition")
    assert [c["spec"] for c in crds] == [c["spec"] for c in all_crds()]
    for crd, generated in zip(crds, all_crds(), strict=True):
        meta = crd["metadata"]
        assert meta["name"] == generated["metadata"]["name"]
        assert meta["annotations"] == {
            **generated["metadata"]["annotations"],
            "helm.sh/resource-policy": "keep",
        }
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "Helm"
        assert meta["labels"]["app.kubernetes.io/component"] == "crds"


def test_the_controller_reads_the_custom_resources_and_writes_only_their_status(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    for name in ("default", NO_CONFIGMAPS.name):
        cluster = rules_of(rendered[name], "controller")[("ClusterRole", "")]
        crs = [r for r in cluster if r["apiGroups"] == ["gpuplace.io"]]
        assert crs == [
            {
                "apiGroups": ["gpuplace.io"],
                "resources": ["placementmaps", "placementpolicies"],
                "verbs": ["get", "list", "watch"],
            },
            {
                "apiGroups": ["gpuplace.io"],
                "resources": ["placementmaps/status", "placementpolicies/status"],
                "verbs": ["patch", "update"],
            },
        ]


def test_configmap_maps_off_narrows_the_controller_to_its_namespaces(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    on = rules_of(rendered["default"], "controller")
    off = rules_of(rendered[NO_CONFIGMAPS.name], "controller")
    assert grants(on[("ClusterRole", "")], "list", "configmaps")
    assert not any("configmaps" in r["resources"] for r in off[("ClusterRole", "")])
    # What it still needs: the model and policy in its namespace, the agents' inventories.
    for namespace in (NAMESPACE, "gpuplace-inventory"):
        for verb in ("get", "list", "watch"):
            assert grants(off[("Role", namespace)], verb, "configmaps"), (namespace, verb)
    assert "--configmap-maps" in container(rendered["default"], "controller")["args"]
    assert "--no-configmap-maps" in container(rendered[NO_CONFIGMAPS.name], "controller")["args"]


def test_the_webhook_validates_the_custom_resources_on_a_new_spec(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    hooks = webhooks(rendered["default"])
    assert set(hooks) == {"placementmaps.gpuplace.io", "placementmap-resources.gpuplace.io"}
    resources = hooks["placementmap-resources.gpuplace.io"]
    assert resources["rules"] == [
        {
            "apiGroups": ["gpuplace.io"],
            "apiVersions": ["v1alpha1"],
            "operations": ["CREATE", "UPDATE"],
            "resources": ["placementmaps", "placementpolicies"],
            "scope": "*",
        }
    ]
    assert resources["clientConfig"]["service"]["path"] == "/validate"
    (condition,) = resources["matchConditions"]
    assert "object.spec != oldObject.spec" in condition["expression"]
    assert "objectSelector" not in resources


def test_configmap_maps_off_drops_the_configmap_webhook(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    assert set(webhooks(rendered[NO_CONFIGMAPS.name])) == {"placementmap-resources.gpuplace.io"}


def test_values_document_both_switches() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["crds"] == {"managed": False}
    assert values["maps"] == {"configMaps": {"enabled": True}}
    text = (CHART / "values.yaml").read_text()
    assert "--skip-crds" in text and "helm.sh/resource-policy: keep" in text


def test_namespace_users_get_placementmaps_through_the_aggregated_roles(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    objects = rendered["default"]
    edit = one(objects, "ClusterRole", "gpuplace-maps-edit")
    view = one(objects, "ClusterRole", "gpuplace-maps-view")
    edit_labels, view_labels = edit["metadata"]["labels"], view["metadata"]["labels"]
    assert edit_labels["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    assert edit_labels["rbac.authorization.k8s.io/aggregate-to-admin"] == "true"
    assert "rbac.authorization.k8s.io/aggregate-to-view" not in edit_labels
    assert view_labels["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    assert set(view["rules"][0]["verbs"]) == {"get", "list", "watch"}
    for role in (edit, view):
        # The maps only: never their status (the controller's verdict), nor the cluster's policy.
        assert [r["resources"] for r in role["rules"]] == [["placementmaps"]]
