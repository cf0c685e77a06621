"""argocd/fleet/: the chart and the maps on every ArgoCD cluster labelled gpuplace.io/enabled,
values shared then per cluster, maps per cluster only, and every mismatch between clusters and
cluster directories reported by an Application that names it."""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chartkit import ARGOCD, CHART, NAMESPACE, REPO, helm

FLEET = ARGOCD / "fleet"
CLUSTERS = REPO / "examples" / "gitops" / "clusters"
ENABLED = {"gpuplace.io/enabled": "true"}


def load(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((FLEET / name).read_text())
    return doc


def appset(name: str) -> dict[str, Any]:
    return load(f"applicationset-{name}.yaml")


def fill(template: Any, params: dict[str, str]) -> Any:
    """The template with ArgoCD's Go-template fields (`{{ .name }}`, `{{ .path.basename }}`)
    replaced by `params`, as the ApplicationSet controller renders one Application; a field
    `params` lacks fails, as goTemplateOptions missingkey=error makes ArgoCD fail."""
    text = yaml.safe_dump(template)

    def one(match: re.Match[str]) -> str:
        key = match.group(1)
        assert key in params, f"no parameter {key} for {{{{ .{key} }}}}"
        return params[key]

    return yaml.safe_load(re.sub(r"\{\{ \.([\w.]+) \}\}", one, text))


def cluster_params(name: str) -> dict[str, str]:
    return {"name": name, "server": f"https://{name}.example:6443"}


def directories() -> list[Path]:
    found = sorted(p for p in CLUSTERS.iterdir() if p.is_dir())
    assert found
    return found


def test_every_fleet_applicationset_is_go_templated_and_fails_on_a_missing_field() -> None:
    for path in sorted(FLEET.glob("applicationset-*.yaml")):
        doc = yaml.safe_load(path.read_text())
        assert doc["kind"] == "ApplicationSet" and doc["metadata"]["namespace"] == "argocd"
        assert doc["spec"]["goTemplate"] is True
        assert doc["spec"]["goTemplateOptions"] == ["missingkey=error"], path.name


def test_the_chart_goes_to_every_labelled_cluster_with_shared_then_own_values(
    tmp_path: Path,
) -> None:
    spec = appset("gpuplace")["spec"]
    (generator,) = spec["generators"]
    assert generator["clusters"]["selector"]["matchLabels"] == ENABLED
    assert spec["syncPolicy"]["preserveResourcesOnDeletion"] is True
    for directory in directories():
        app = fill(spec["template"], cluster_params(directory.name))
        source = app["spec"]["source"]
        assert REPO / source["path"] == CHART
        assert app["spec"]["destination"] == {
            "server": f"https://{directory.name}.example:6443",
            "namespace": NAMESPACE,
        }
        files = [(CHART / f).resolve() for f in source["helm"]["valueFiles"]]
        assert files == [REPO / "examples/gitops/values.yaml", directory / "values.yaml"]
        # No ignoreMissingValueFiles: a labelled cluster without its directory fails by name.
        assert not source["helm"].get("ignoreMissingValueFiles")
        parameters = {p["name"]: p["value"] for p in source["helm"]["parameters"]}
        assert parameters == {"global.cluster": directory.name}
        args = [f"--values={f}" for f in files]
        args += [f"--set={k}={v}" for k, v in parameters.items()]
        args += ["--set=global.serviceMonitor.enabled=true"]
        out = helm("template", "gpuplace", str(CHART), "-n", NAMESPACE, *args).stdout
        assert f"replacement: {directory.name}" in out or f'replacement: "{directory.name}"' in out


def test_the_fleet_chart_applications_keep_the_single_cluster_sync_and_ignore_rules() -> None:
    single = yaml.safe_load((ARGOCD / "application-gpuplace.yaml").read_text())["spec"]
    fleet = appset("gpuplace")["spec"]["template"]["spec"]
    for key in ("syncPolicy", "ignoreDifferences", "project"):
        assert fleet[key] == single[key], key
    assert fleet["source"]["helm"]["releaseName"] == single["source"]["helm"]["releaseName"]
    # The single cluster's inline values are the fleet's shared values file.
    shared = yaml.safe_load((REPO / "examples/gitops/values.yaml").read_text())
    assert shared == single["source"]["helm"]["valuesObject"]


def test_maps_are_a_matrix_of_labelled_clusters_and_their_own_directory() -> None:
    spec = appset("placement-maps")["spec"]
    (generator,) = spec["generators"]
    clusters, git = generator["matrix"]["generators"]
    assert clusters["clusters"]["selector"]["matchLabels"] == ENABLED
    (directory,) = git["git"]["directories"]
    assert directory["path"] == "examples/gitops/clusters/{{ .name }}"
    assert spec["syncPolicy"]["preserveResourcesOnDeletion"] is True
    for path in directories():
        params = cluster_params(path.name) | {"path.path": str(path.relative_to(REPO))}
        app = fill(spec["template"], params)
        assert app["metadata"]["name"] == f"gpuplace-maps-{path.name}"
        assert app["spec"]["destination"]["server"] == params["server"]
        assert REPO / app["spec"]["source"]["path"] == path
        assert (path / "kustomization.yaml").is_file()


def test_inside_each_maps_application_the_fleet_does_what_one_cluster_does() -> None:
    """Waves, provenance stamps, server-side apply, retries: as argocd/'s single-cluster
    ApplicationSet (test_argocd.py checks those); only the name and destination differ."""
    single = yaml.safe_load((ARGOCD / "applicationset-placement-maps.yaml").read_text())["spec"]
    fleet = appset("placement-maps")["spec"]
    for key in ("source", "syncPolicy", "ignoreDifferences", "project"):
        assert fleet["template"]["spec"][key] == single["template"]["spec"][key], key
    assert fleet["syncPolicy"] == single["syncPolicy"]
    assert "name" not in fleet["template"]["spec"]["destination"]


def test_every_directory_is_checked_against_a_cluster_of_its_name_and_deploys_nothing() -> None:
    spec = appset("cluster-directories")["spec"]
    (generator,) = spec["generators"]
    maps = appset("placement-maps")["spec"]["generators"][0]["matrix"]["generators"][1]
    assert generator["git"]["repoURL"] == maps["git"]["repoURL"]
    assert generator["git"]["directories"] == [{"path": "examples/gitops/clusters/*"}]
    for path in directories():
        app = fill(
            spec["template"],
            {"path.basename": path.name, "path.path": str(path.relative_to(REPO))},
        )
        assert app["metadata"]["name"] == f"gpuplace-directory-{path.name}"
        # ArgoCD resolves the destination by name: for no such cluster the ApplicationSet's
        # condition names it (tests/e2e_argocd/test_argocd_fleet.py).
        assert app["spec"]["destination"]["name"] == path.name
        include = app["spec"]["source"]["directory"]["include"]
        files = [p.name for p in path.rglob("*") if p.is_file()]
        assert not [f for f in files if fnmatch.fnmatch(f, include)]
        assert "prune" in app["spec"]["syncPolicy"]["automated"]


def test_the_fleet_root_syncs_the_project_and_every_fleet_applicationset() -> None:
    root = load("root.yaml")["spec"]
    assert root["source"]["path"] == "argocd"
    assert root["source"]["directory"]["recurse"] is True
    patterns = root["source"]["directory"]["include"].strip("{}").split(",")
    files = [str(p.relative_to(ARGOCD)) for p in ARGOCD.rglob("*.yaml")]
    included = sorted(f for f in files if any(fnmatch.fnmatch(f, p) for p in patterns))
    assert included == [
        "fleet/applicationset-cluster-directories.yaml",
        "fleet/applicationset-gpuplace.yaml",
        "fleet/applicationset-placement-maps.yaml",
        "project.yaml",
    ]


def wave(doc: dict[str, Any]) -> int:
    return int(doc["metadata"]["annotations"]["argocd.argoproj.io/sync-wave"])


def test_the_chart_applicationset_comes_before_the_maps() -> None:
    project = yaml.safe_load((ARGOCD / "project.yaml").read_text())
    assert wave(project) < wave(appset("gpuplace")) < wave(appset("placement-maps"))
    assert wave(appset("cluster-directories")) == wave(appset("placement-maps"))


@pytest.mark.parametrize("name", ["gpuplace", "placement-maps", "cluster-directories"])
def test_every_fleet_source_is_a_repository_the_project_allows(name: str) -> None:
    allowed = set(yaml.safe_load((ARGOCD / "project.yaml").read_text())["spec"]["sourceRepos"])
    spec = appset(name)["spec"]
    assert spec["template"]["spec"]["source"]["repoURL"] in allowed
    text = yaml.safe_dump(spec["generators"])
    assert set(re.findall(r"repoURL: (\S+)", text)) <= allowed
