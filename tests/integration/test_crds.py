"""The PlacementMap and PlacementPolicy CRDs on the real apiserver (LocalCluster installs them):
`kubectl apply -f`, `kubectl get pm` with its columns, `kubectl explain` with the models'
descriptions, and refusals that name the field, agreeing with gpuplace's own validation
(tests/crdcases.py). No controller or webhook runs here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuplace_dev.localcluster import LocalCluster
from kubeio.paths import PLACEMENT_MAPS, PLACEMENT_POLICIES
from placement.resourcestatus import resource_status
from placement.status import MapStatus, Phase, SlotCounts
from tests.crdcases import MAP_CASES, NODES, POLICY_CASES, Case, placement_map, placement_policy
from tests.integration.controllerkit import wait_for

pytestmark = pytest.mark.integration

MAP = """\
apiVersion: gpuplace.io/v1alpha1
kind: PlacementMap
metadata:
  name: llm-serving
  namespace: {namespace}
spec:
  placements:
    - index: 0
      node: {node0}
      devices: [0, 1]
    - index: 1
      node: {node1}
      count: 2
      require: {{minMemoryMiB: 1024}}
"""


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "object.yaml"
    path.write_text(text)
    return str(path)


def map_text(namespace: str, **replace: str) -> str:
    text = MAP.format(namespace=namespace, node0=NODES[0], node1=NODES[1])
    for old, new in replace.items():
        text = text.replace(old, new)
    return text


def refused(result: Any) -> str:
    assert result.returncode != 0, result.stdout
    return str(result.stderr)


def test_apply_then_get_shows_the_columns_and_the_status(
    cluster: LocalCluster, namespace: str, tmp_path: Path
) -> None:
    applied = cluster.kubectl("apply", "-f", write(tmp_path, map_text(namespace)))
    assert "placementmap.gpuplace.io/llm-serving created" in applied.stdout
    # The controller's status write, through the status subresource.
    status = MapStatus(Phase.VALID, 7, "abc", "2 of 2 slots served", slots=SlotCounts(2, 2, 1))
    body = {"status": resource_status(status, 1, None, "2026-11-26T00:00:00Z")}
    code, response = cluster.request(
        "PATCH", PLACEMENT_MAPS.item("llm-serving", namespace, "status"), body
    )
    assert code == 200, response
    assert response["metadata"]["generation"] == 1  # status writes leave the spec's generation

    table = cluster.kubectl("get", "pm", "-A").stdout.splitlines()
    assert table[0].split() == ["NAMESPACE", "NAME", "PHASE", "SLOTS", "BOUND", "DRIFTED", "AGE"]
    row = next(line.split() for line in table if line.startswith(namespace))
    assert row[:6] == [namespace, "llm-serving", "Valid", "2", "1", "0"]
    wide = cluster.kubectl("get", "placementmaps", "-n", namespace, "-o", "wide").stdout
    assert "MESSAGE" in wide and "2 of 2 slots served" in wide
    assert "llm-serving" in cluster.kubectl("get", "gpuplace", "-n", namespace).stdout


def test_explain_prints_the_models_descriptions(cluster: LocalCluster) -> None:
    def explained() -> str:
        result = cluster.kubectl("explain", "placementmap.spec.placements", check=False)
        return result.stdout if "devices" in result.stdout else ""

    # The apiserver publishes a new CRD's OpenAPI a moment after it is Established.
    text = " ".join(wait_for("kubectl explain placementmap", explained, timeout=90).split())
    assert "The slots, one entry per index (unique); exclusive with map." in text
    assert "NVML indices, GPU UUIDs (GPU-...) or quoted PCI bus IDs" in text
    assert "index <integer> -required-" in text
    policy = cluster.kubectl("explain", "placementpolicy.spec.grants").stdout
    assert "namespaces" in policy and "nodeSelector" in policy


@pytest.mark.parametrize(
    ("name", "replace", "field"),
    [
        ("count-not-an-integer", {"count: 2": "count: two"}, "spec.placements[1].count"),
        (
            "devices-and-count",
            {"count: 2": "count: 2\n      devices: [3]"},
            "spec.placements[1]: Invalid value: give exactly one of 'devices'",
        ),
        ("duplicate-index", {"index: 1": "index: 0"}, "spec.placements[1]: Duplicate value"),
        (
            "unknown-field",
            {"count: 2": "count: 2\n      devcies: [3]"},
            'unknown field "spec.placements[1].devcies"',
        ),
    ],
)
def test_kubectl_apply_refuses_a_schema_error_naming_the_field(
    cluster: LocalCluster,
    namespace: str,
    tmp_path: Path,
    name: str,
    replace: dict[str, str],
    field: str,
) -> None:
    text = map_text(namespace, **replace)
    assert text != map_text(namespace), name
    # kubectl's default --validate=strict: the apiserver refuses unknown fields too.
    message = refused(cluster.kubectl("apply", "-f", write(tmp_path, text), check=False))
    assert field in message, message
    assert "admission webhook" not in message  # the schema, before any webhook


def test_a_policy_of_another_name_is_refused(cluster: LocalCluster, tmp_path: Path) -> None:
    text = yaml.safe_dump(placement_policy(Case("cluster", {}, metadata_name="cluster")))
    result = cluster.kubectl("apply", "--dry-run=server", "-f", write(tmp_path, text), check=False)
    message = refused(result)
    assert "metadata.name" in message
    assert "the cluster has one placement policy, named gpuplace-policy" in message


def dry_run_create(cluster: LocalCluster, path: str, body: dict[str, Any]) -> tuple[int, str]:
    code, response = cluster.request("POST", f"{path}?dryRun=All&fieldValidation=Strict", body)
    return code, json.dumps(response) if code != 201 else ""


def assert_agrees(case: Case, code: int, message: str) -> None:
    if case.valid:
        # Schema validation runs before validating webhooks; one of another test may still
        # refuse (a denial it explains), which means the schema accepted the object.
        assert code == 201 or "admission webhook" in message, message
    else:
        assert code == 422, (code, message)
        assert case.field in message, message


@pytest.mark.parametrize("case", MAP_CASES, ids=str)
def test_the_apiserver_agrees_with_gpuplace_on_maps(
    cluster: LocalCluster, namespace: str, case: Case
) -> None:
    path = PLACEMENT_MAPS.collection(namespace)
    assert_agrees(case, *dry_run_create(cluster, path, placement_map(case, namespace)))


@pytest.mark.parametrize("case", POLICY_CASES, ids=str)
def test_the_apiserver_agrees_with_gpuplace_on_policies(cluster: LocalCluster, case: Case) -> None:
    path = PLACEMENT_POLICIES.collection()
    assert_agrees(case, *dry_run_create(cluster, path, placement_policy(case)))
