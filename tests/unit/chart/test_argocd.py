"""argocd/: the project whitelists exactly what gpuplace renders, the Applications point at what the
repository holds, sync waves order chart before maps, and argocd-cm embeds the health script."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chartkit import ARGOCD, CHART, NAMESPACE, REPO, SCENARIOS, argocd_documents, helm, render

EXAMPLE_APPSET = REPO / "examples" / "gitops" / "argocd" / "applicationset.yaml"

LUA = ARGOCD / "health" / "configmap.lua"
#: argocd-cm key -> the script it embeds, for gpuplace's custom resources (group_Kind keys).
RESOURCE_HEALTH = {
    "resource.customizations.health.gpuplace.io_PlacementMap": "placementmap.lua",
    "resource.customizations.health.gpuplace.io_PlacementPolicy": "placementpolicy.lua",
}


def documents(kind: str) -> list[dict[str, Any]]:
    return [doc for _, doc in argocd_documents() if doc["kind"] == kind]


def only(kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in documents(kind) if name is None or d["metadata"]["name"] == name]
    assert len(found) == 1, (kind, name, len(found))
    return found[0]


def wave(obj: dict[str, Any]) -> int:
    return int(obj["metadata"].get("annotations", {}).get("argocd.argoproj.io/sync-wave", "0"))


def test_every_file_holds_argocd_or_its_settings() -> None:
    kinds = sorted((path.name, doc["kind"]) for path, doc in argocd_documents())
    assert kinds == [
        ("application-gpuplace.yaml", "Application"),
        ("applicationset-placement-maps.yaml", "ApplicationSet"),
        ("argocd-cm.yaml", "ConfigMap"),
        ("project.yaml", "AppProject"),
        ("root.yaml", "Application"),
    ]
    for _, doc in argocd_documents():
        assert doc["metadata"]["namespace"] == "argocd"


def test_argocd_cm_embeds_the_health_script_verbatim() -> None:
    data = only("ConfigMap", "argocd-cm")["data"]
    assert data["resource.customizations.health.ConfigMap"] == LUA.read_text()
    # Custom health scripts run without Lua's string library unless asked for it.
    assert data["resource.customizations.useOpenLibs.ConfigMap"] == "true"


def test_argocd_cm_embeds_the_custom_resource_health_scripts_verbatim() -> None:
    data = only("ConfigMap", "argocd-cm")["data"]
    for key, script in RESOURCE_HEALTH.items():
        assert data[key] == (ARGOCD / "health" / script).read_text(), key
    # They read plain fields: no useOpenLibs for their kinds (tests run them without the string
    # library, as ArgoCD does).
    assert not [k for k in data if k.startswith("resource.customizations.useOpenLibs.gpuplace")]


def test_argocd_cm_gives_applications_their_own_health() -> None:
    """Without it ArgoCD reports every Application Healthy, and root.yaml's sync waves would apply
    the maps before the chart's webhook is up."""
    data = only("ConfigMap", "argocd-cm")["data"]
    script = ARGOCD / "health" / "application.lua"
    assert data["resource.customizations.health.argoproj.io_Application"] == script.read_text()


@pytest.fixture(scope="module")
def chart_kinds(tmp_path_factory: pytest.TempPathFactory) -> set[tuple[str, str]]:
    tmp = tmp_path_factory.mktemp("values")
    kinds = set()
    for scenario in SCENARIOS:
        for obj in render(scenario, tmp):
            group = obj["apiVersion"].rpartition("/")[0]
            kinds.add((group, obj["kind"]))
    return kinds


def test_project_whitelists_exactly_the_kinds_gpuplace_uses(
    chart_kinds: set[tuple[str, str]],
) -> None:
    project = only("AppProject", "gpuplace")["spec"]
    whitelisted = {
        (entry["group"], entry["kind"])
        for key in ("clusterResourceWhitelist", "namespaceResourceWhitelist")
        for entry in project[key]
    }
    # Beyond the chart: the placement-map ConfigMaps and their namespaces (already chart kinds),
    # the maps and the policy as custom resources and their CRDs (the chart's, whether rendered
    # from templates or from crds/), and the preflight Workflow (`gpuplace preflight`, a PreSync
    # hook next to the maps).
    used = chart_kinds | {
        ("", "ConfigMap"),
        ("", "Namespace"),
        ("argoproj.io", "Workflow"),
        ("apiextensions.k8s.io", "CustomResourceDefinition"),
        ("gpuplace.io", "PlacementMap"),
        ("gpuplace.io", "PlacementPolicy"),
    }
    assert whitelisted == used
    cluster_scoped = {(e["group"], e["kind"]) for e in project["clusterResourceWhitelist"]}
    assert cluster_scoped == {
        ("", "Namespace"),
        ("rbac.authorization.k8s.io", "ClusterRole"),
        ("rbac.authorization.k8s.io", "ClusterRoleBinding"),
        ("admissionregistration.k8s.io", "MutatingWebhookConfiguration"),
        ("admissionregistration.k8s.io", "ValidatingAdmissionPolicy"),
        ("admissionregistration.k8s.io", "ValidatingAdmissionPolicyBinding"),
        ("admissionregistration.k8s.io", "ValidatingWebhookConfiguration"),
        ("apiextensions.k8s.io", "CustomResourceDefinition"),
        ("gpuplace.io", "PlacementPolicy"),
    }


def test_every_source_comes_from_a_repository_the_project_allows() -> None:
    allowed = set(only("AppProject", "gpuplace")["spec"]["sourceRepos"])
    chart_app = only("Application", "gpuplace")
    appset = only("ApplicationSet")
    assert chart_app["spec"]["source"]["repoURL"] in allowed
    assert appset["spec"]["template"]["spec"]["source"]["repoURL"] in allowed
    assert all(g["git"]["repoURL"] in allowed for g in appset["spec"]["generators"])
    assert (
        chart_app["spec"]["project"] == appset["spec"]["template"]["spec"]["project"] == "gpuplace"
    )


def test_chart_application_installs_this_chart_with_valid_values(tmp_path: Path) -> None:
    spec = only("Application", "gpuplace")["spec"]
    assert REPO / spec["source"]["path"] == CHART
    assert spec["destination"]["namespace"] == NAMESPACE
    assert "ServerSideApply=true" in spec["syncPolicy"]["syncOptions"]
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(spec["source"]["helm"]["valuesObject"]))
    helm(
        "template",
        spec["source"]["helm"]["releaseName"],
        str(CHART),
        "-n",
        NAMESPACE,
        "-f",
        str(values),
    )


def test_chart_application_ignores_exactly_what_gpuplace_writes_at_runtime(tmp_path: Path) -> None:
    objects = render(SCENARIOS[0], tmp_path)
    names = {(o["kind"], o["metadata"]["name"]) for o in objects}
    for entry in only("Application", "gpuplace")["spec"]["ignoreDifferences"]:
        assert (entry["kind"], entry["name"]) in names
    assert (
        "RespectIgnoreDifferences=true"
        in only("Application", "gpuplace")["spec"]["syncPolicy"]["syncOptions"]
    )
    # The binding key ring is the controller's to write: a sync never compares or overwrites it.
    ignored = only("Application", "gpuplace")["spec"]["ignoreDifferences"]
    assert {"group": "", "kind": "Secret", "name": "gpuplace-binding-key"}.items() <= next(
        e for e in ignored if e["name"] == "gpuplace-binding-key"
    ).items()
    assert next(e for e in ignored if e["name"] == "gpuplace-binding-key")["jsonPointers"] == [
        "/data"
    ]


def test_placement_maps_applicationset_reads_the_gitops_cluster_directories() -> None:
    spec = only("ApplicationSet", "gpuplace-placement-maps")["spec"]
    (generator,) = spec["generators"]
    (directory,) = generator["git"]["directories"]
    assert directory["path"] == "examples/gitops/clusters/*"
    clusters = sorted(p for p in (REPO / "examples/gitops/clusters").iterdir() if p.is_dir())
    assert clusters, "no cluster directories to generate Applications for"
    assert all((p / "kustomization.yaml").is_file() for p in clusters)
    template = spec["template"]["spec"]
    assert "kustomize" in template["source"]
    assert "ServerSideApply=true" in template["syncPolicy"]["syncOptions"]
    assert spec["syncPolicy"]["preserveResourcesOnDeletion"] is True


def test_sync_waves_put_the_chart_before_the_maps_before_the_workloads() -> None:
    chart = only("Application", "gpuplace")
    maps = only("ApplicationSet", "gpuplace-placement-maps")
    project = only("AppProject", "gpuplace")
    assert wave(project) < wave(chart) < wave(maps)
    # Inside each maps Application: namespaces, then maps; workload Applications use wave 10.
    patches = maps["spec"]["template"]["spec"]["source"]["kustomize"]["patches"]
    by_kind = {
        p["target"]["kind"]: int(
            yaml.safe_load(p["patch"])["metadata"]["annotations"]["argocd.argoproj.io/sync-wave"]
        )
        for p in patches
    }
    assert by_kind["Namespace"] < by_kind["ConfigMap"] == wave(maps) < 10
    map_patch = next(p for p in patches if p["target"]["kind"] == "ConfigMap")
    assert map_patch["target"]["labelSelector"] == "gpuplace.io/placement-map=true"
    # Either form of a map goes out in the same wave, after the grants that admit it.
    assert by_kind["PlacementMap"] == by_kind["ConfigMap"]
    assert by_kind["Namespace"] == by_kind["PlacementPolicy"] < by_kind["PlacementMap"]
    for kind in ("PlacementMap", "PlacementPolicy"):
        patch = next(p for p in patches if p["target"]["kind"] == kind)
        assert patch["target"]["group"] == "gpuplace.io"
        assert yaml.safe_load(patch["patch"])["apiVersion"] == "gpuplace.io/v1alpha1"


def test_the_maps_are_synced_server_side_so_unknown_fields_fail_the_sync() -> None:
    """With server-side apply the apiserver refuses a field the CRD does not declare ("field not
    declared in schema"); ArgoCD sends no fieldValidation, so client-side apply would have the
    apiserver drop it with a warning instead."""
    for source in (ARGOCD / "applicationset-placement-maps.yaml", EXAMPLE_APPSET):
        template = yaml.safe_load(source.read_text())["spec"]["template"]["spec"]
        options = template["syncPolicy"]["syncOptions"]
        assert "ServerSideApply=true" in options, source
        assert "Validate=false" not in options, source


def test_root_application_syncs_the_project_and_both_applications() -> None:
    root = only("Application", "gpuplace-root")["spec"]
    assert root["source"]["path"] == "argocd"
    included = root["source"]["directory"]["include"].strip("{}").split(",")
    files = {
        path.name
        for path, doc in argocd_documents()
        if doc["kind"] in ("AppProject", "ApplicationSet")
    }
    files |= {
        path.name for path, doc in argocd_documents() if doc["metadata"]["name"] == "gpuplace"
    }
    assert set(included) == files
    assert all((ARGOCD / name).is_file() for name in included)
