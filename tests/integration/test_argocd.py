"""argocd/ against the real apiserver with ArgoCD's own CRDs (Application, ApplicationSet,
AppProject from the argo-cd Go module's manifests/crds): every manifest passes
`kubectl apply --dry-run=server` with strict field validation."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpuplace_dev.localcluster import LocalCluster
from tests.chartkit import ARGOCD, dry_run, install_crds


@pytest.fixture(scope="module")
def argocd_cluster(cluster: LocalCluster) -> LocalCluster:
    names = install_crds(cluster, "argocd")
    assert set(names) == {
        "applications.argoproj.io",
        "applicationsets.argoproj.io",
        "appprojects.argoproj.io",
    }
    cluster.create_namespace("argocd")
    return cluster


@pytest.mark.parametrize("path", sorted(ARGOCD.glob("*.yaml")), ids=lambda p: p.name)
def test_argocd_manifest_passes_server_side_dry_run(
    argocd_cluster: LocalCluster, path: Path
) -> None:
    result = dry_run(argocd_cluster, path.read_text())
    assert result.returncode == 0, result.stderr
    assert "(server dry run)" in result.stdout


@pytest.mark.parametrize(
    ("file", "mutate", "complaint"),
    [
        # A misspelt field: the CRD schema does not know it.
        (
            "application-gpuplace.yaml",
            lambda d: d["spec"]["syncPolicy"].update(automatic={}),
            "automatic",
        ),
        # A wrong type: prune is a boolean.
        (
            "application-gpuplace.yaml",
            lambda d: d["spec"]["syncPolicy"]["automated"].update(prune="yes"),
            "prune",
        ),
        # A required field left out.
        ("project.yaml", lambda d: d["spec"]["clusterResourceWhitelist"][0].pop("kind"), "kind"),
    ],
    ids=["unknown-field", "wrong-type", "missing-required"],
)
def test_the_crd_schemas_do_check(
    argocd_cluster: LocalCluster, file: str, mutate: object, complaint: str
) -> None:
    """The dry runs above can fail: ArgoCD's CRDs reject a broken manifest."""
    document = yaml.safe_load((ARGOCD / file).read_text())
    mutate(document)  # type: ignore[operator]
    result = dry_run(argocd_cluster, yaml.safe_dump(document))
    assert result.returncode != 0
    assert complaint in result.stderr
