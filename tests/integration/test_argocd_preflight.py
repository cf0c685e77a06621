"""The `gpuplace preflight` Workflow against the Argo Workflows CRD with its full OpenAPI schema
(manifests/base/crds/full of the argo-workflows Go module, the version the Python SDK targets):
accepted by `kubectl apply --dry-run=server`, for a hand-written map and for every map in
examples/gitops."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpuplace.preflight import PreflightSettings, workflow_manifest
from gpuplace_dev.localcluster import LocalCluster
from placement.validate import load_maps
from tests.chartkit import REPO, dry_run, install_crds

EXAMPLE_MAPS = sorted((REPO / "examples" / "gitops" / "clusters").glob("*/maps/*.yaml"))
MAP = """\
apiVersion: gpuplace.io/v1alpha1
kind: PlacementMap
metadata: {name: llm-serving, namespace: inference}
spec:
  placements:
    - {index: 0, node: gpu-a-01, devices: [0, 1]}
    - {index: 1, node: gpu-a-02, devices: [GPU-5c1d0c3e-8c6a-4f4e-9a1b-2f6e7d8c9b0a]}
    - {index: 2, node: gpu-b-01, count: 2, require: {product: "NVIDIA H100 80GB HBM3", minMemoryMiB: 80000}}
"""


@pytest.fixture(scope="module")
def workflows_cluster(cluster: LocalCluster) -> LocalCluster:
    names = install_crds(cluster, "argo-workflows")
    assert "workflows.argoproj.io" in names
    crd = yaml.safe_load(cluster.kubectl("get", "crd/workflows.argoproj.io", "-o", "yaml").stdout)
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    # The full CRD: the spec is described down to its fields (the minimal one preserves anything).
    assert "templates" in schema["properties"]["spec"]["properties"]
    return cluster


def workflows_of(path: Path, namespace: str) -> list[dict[str, object]]:
    result = load_maps(path.read_text(), str(path))
    assert not result.diagnostics, [d.format() for d in result.diagnostics]
    return [workflow_manifest(m, PreflightSettings(namespace=namespace)) for m in result.maps]


@pytest.mark.slow
def test_preflight_workflow_passes_server_side_dry_run(
    workflows_cluster: LocalCluster, namespace: str
) -> None:
    for settings in (
        PreflightSettings(namespace=namespace),
        PreflightSettings(
            namespace=namespace,
            runtime_class="nvidia",
            service_account="preflight",
            argocd_hook=False,
            nvml_host_path="/usr/lib/nvidia",
            env=(("GPUPLACE_FAKE_NVML_CONFIG", "/opt/gpuplace/nvml/nvml.json"),),
        ),
    ):
        document = workflow_manifest(load_maps(MAP, "map.yaml").maps[0], settings)
        result = dry_run(workflows_cluster, yaml.safe_dump(document))
        assert result.returncode == 0, result.stderr
        assert (
            "workflow.argoproj.io/gpuplace-preflight-llm-serving created (server dry run)"
            in result.stdout
        )


@pytest.mark.parametrize("path", EXAMPLE_MAPS, ids=lambda p: f"{p.parent.parent.name}/{p.name}")
def test_preflight_of_every_example_map_passes(
    workflows_cluster: LocalCluster, namespace: str, path: Path
) -> None:
    documents = workflows_of(path, namespace)
    assert documents
    result = dry_run(workflows_cluster, yaml.safe_dump_all(documents))
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    ("field", "value"),
    [("parallelism", "twenty"), ("nodeSelectr", {})],
    ids=["wrong-type", "unknown-field"],
)
def test_the_workflow_schema_does_check(
    workflows_cluster: LocalCluster, namespace: str, field: str, value: object
) -> None:
    """The dry runs above can fail: the full schema refuses a mistyped or unknown field."""
    document = workflow_manifest(
        load_maps(MAP, "map.yaml").maps[0], PreflightSettings(namespace=namespace)
    )
    document["spec"][field] = value  # type: ignore[index]
    result = dry_run(workflows_cluster, yaml.safe_dump(document))
    assert result.returncode != 0
    assert field in result.stderr
