"""The PlacementMap and PlacementPolicy CRDs: generated from the models (one source), the rules
they add mirrored by gpuplace's own validation, the status the controller writes declared, and
`gpuplace crds` with the committed files in charts/gpuplace/crds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel, ValidationError

from controller.policystatus import PolicyVerdict
from gpuplace.cli import main
from gpuplace.commands.crds import crd_files, stale_files
from placement.crd import (
    MAP_RULES,
    POLICY_RULES,
    placement_map_crd,
    placement_policy_crd,
)
from placement.errors import Diagnostic, Location, PlacementError
from placement.grants import POLICY_CONFIGMAP
from placement.openapi import SchemaError, structural_schema
from placement.policyschema import PolicySpec
from placement.resource import map_from_resource
from placement.resourcestatus import resource_status
from placement.schema import MapSpec, PlacementSpec
from placement.status import GangStatus, MapStatus, Phase, SlotCounts
from placement.types import MAX_PLACEMENTS
from tests.chartkit import CHART
from tests.crdcases import MAP_CASES, Case, placement_map

CRDS_DIR = CHART / "crds"


def version_of(crd: dict[str, Any]) -> dict[str, Any]:
    versions = crd["spec"]["versions"]
    assert len(versions) == 1
    return dict(versions[0])


def root_of(crd: dict[str, Any]) -> dict[str, Any]:
    return dict(version_of(crd)["schema"]["openAPIV3Schema"])


def at(schema: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    for step in path:
        schema = schema["items"] if step == "[]" else schema["properties"][step]
    return schema


# ------------------------------------------------------------------------------- one source


def test_the_committed_crds_are_the_generated_ones() -> None:
    assert stale_files(CRDS_DIR) == [], "run `make crds`"
    assert sorted(p.name for p in CRDS_DIR.glob("*.yaml")) == sorted(crd_files())


@pytest.mark.parametrize(
    ("crd", "model", "rules"),
    [
        (placement_map_crd(), MapSpec, MAP_RULES),
        (placement_policy_crd(), PolicySpec, POLICY_RULES),
    ],
    ids=["placementmap", "placementpolicy"],
)
def test_the_crd_says_what_the_model_says_plus_its_listed_rules(
    crd: dict[str, Any], model: type[BaseModel], rules: dict[tuple[str, ...], dict[str, Any]]
) -> None:
    spec = root_of(crd)["properties"]["spec"]
    expected = structural_schema(model)

    def compare(want: dict[str, Any], got: dict[str, Any], path: tuple[str, ...]) -> None:
        overridden = set(rules.get(path, {}))
        for key, value in want.items():
            if key in ("properties", "items") or key in overridden:
                continue
            assert got.get(key) == value, (path, key)
        assert set(got) - set(want) <= overridden, (path, set(got) - set(want))
        for name, child in want.get("properties", {}).items():
            compare(child, got["properties"][name], (*path, name))
        assert set(got.get("properties", {})) == set(want.get("properties", {})), path
        if "items" in want:
            compare(want["items"], got["items"], (*path, "[]"))

    compare(expected, spec, ())


def test_every_field_is_described_for_kubectl_explain() -> None:
    def walk(node: dict[str, Any], path: str) -> None:
        for name, child in node.get("properties", {}).items():
            if path not in ("", ".metadata"):
                assert child.get("description"), f"{path}.{name}"
            walk(child, f"{path}.{name}")
        if "items" in node:
            walk(node["items"], f"{path}[]")

    for crd in (placement_map_crd(), placement_policy_crd()):
        walk(root_of(crd)["properties"]["spec"], ".spec")
        walk(root_of(crd)["properties"]["status"], ".status")
    devices = at(root_of(placement_map_crd()), ("spec", "placements", "[]", "devices"))
    assert devices["description"].startswith(
        "NVML indices, GPU UUIDs (GPU-...) or quoted PCI bus IDs"
    )


def test_both_forms_refuse_more_placements_than_the_crd_allows() -> None:
    placements = at(root_of(placement_map_crd()), ("spec", "placements"))
    assert placements["maxItems"] == MAX_PLACEMENTS
    assert placements["x-kubernetes-list-type"] == "map"
    assert placements["x-kubernetes-list-map-keys"] == ["index"]
    entry = {"index": 0, "node": "n", "count": 1}
    with pytest.raises(ValidationError, match=f"at most {MAX_PLACEMENTS} items"):
        MapSpec.model_validate({"placements": [entry] * (MAX_PLACEMENTS + 1)})
    with pytest.raises(ValidationError, match="at most 64"):
        PlacementSpec.model_validate({"index": 0, "node": "n", "devices": list(range(65))})


def test_a_legacy_map_keeps_its_sharing_unset() -> None:
    """The apiserver must not default `sharing`: a legacy map whose lines share a GPU relies on
    it being omitted (placement/validate.py)."""
    sharing = at(root_of(placement_map_crd()), ("spec", "sharing"))
    assert "default" not in sharing
    assert sharing["enum"] == ["exclusive", "shared"]
    assert at(root_of(placement_map_crd()), ("spec", "indexing"))["default"] == "auto"


@pytest.mark.parametrize("case", MAP_CASES, ids=str)
def test_gpuplace_validation_agrees_with_the_crd(case: Case) -> None:
    """Every object the CRD refuses, the file and custom-resource forms refuse too (and the
    valid ones pass both): the CRD's rules only move refusals earlier."""
    obj = placement_map(case, "team-a")
    if case.valid:
        map_from_resource(obj)
        return
    with pytest.raises(PlacementError):
        map_from_resource(obj)


def test_every_rule_of_the_crd_has_a_case() -> None:
    """tests/crdcases.py refuses something at (or under) every path a rule is added at."""
    fields = {c.field for c in MAP_CASES if not c.valid}
    for path in MAP_RULES:
        if path == ("sharing",):
            continue  # a default removed, not a rule
        prefix = "spec" + "".join("[0]" if s == "[]" else f".{s}" for s in path)
        assert any(f.startswith(prefix) or f"{prefix}[" in f for f in fields), prefix


# ------------------------------------------------------------------------------- shape


def test_placementmap_crd_names_scope_columns_and_status() -> None:
    crd = placement_map_crd()
    assert crd["metadata"]["name"] == "placementmaps.gpuplace.io"
    assert crd["metadata"]["labels"] == {"app.kubernetes.io/part-of": "gpuplace"}
    assert crd["metadata"]["annotations"] == {
        "argocd.argoproj.io/sync-options": "Delete=false,ServerSideApply=true"
    }
    spec = crd["spec"]
    assert (spec["group"], spec["scope"]) == ("gpuplace.io", "Namespaced")
    assert spec["names"]["shortNames"] == ["pm"]
    assert spec["names"]["categories"] == ["gpuplace"]
    version = version_of(crd)
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
    assert version["subresources"] == {"status": {}}
    columns = {c["name"]: c for c in version["additionalPrinterColumns"]}
    assert list(columns) == ["Phase", "Slots", "Bound", "Drifted", "Message", "Age"]
    assert columns["Slots"] == {**columns["Slots"], "type": "integer"}
    assert columns["Drifted"]["jsonPath"] == ".status.slots.drifted"
    assert columns["Message"]["priority"] == 1
    assert columns["Age"]["type"] == "date"
    root = root_of(crd)
    assert root["required"] == ["spec"]
    assert at(root, ("metadata", "name"))["maxLength"] == 63


def test_placementpolicy_crd_is_a_cluster_scoped_singleton() -> None:
    crd = placement_policy_crd()
    spec = crd["spec"]
    assert crd["metadata"]["name"] == "placementpolicies.gpuplace.io"
    assert spec["scope"] == "Cluster"
    assert spec["names"]["shortNames"] == ["gpp"]
    rules = at(root_of(crd), ("metadata", "name"))["x-kubernetes-validations"]
    assert rules[0]["rule"] == f"self == '{POLICY_CONFIGMAP}'"
    columns = [c["name"] for c in version_of(crd)["additionalPrinterColumns"]]
    assert columns == ["Phase", "Message", "Age"]
    status = at(root_of(crd), ("status",))["properties"]
    assert set(status) == {
        "observedGeneration",
        "phase",
        "message",
        "conditions",
        "errors",
        "supersedes",
    }


def conforms(value: Any, schema: dict[str, Any], path: str = "status") -> None:
    """`value` has only fields `schema` declares, of the declared types (no CEL, no formats)."""
    kind = schema.get("type")
    if kind == "object":
        assert isinstance(value, dict), path
        for key, child in value.items():
            assert key in schema["properties"], f"{path}.{key} is not declared"
            conforms(child, schema["properties"][key], f"{path}.{key}")
        assert set(schema.get("required", ())) <= set(value), path
    elif kind == "array":
        assert isinstance(value, list), path
        for i, item in enumerate(value):
            conforms(item, schema["items"], f"{path}[{i}]")
    elif kind == "integer":
        assert isinstance(value, int) and not isinstance(value, bool), path
    elif kind == "string":
        assert isinstance(value, str), path
        if "enum" in schema:
            assert value in schema["enum"], path
        if "maxLength" in schema:
            assert len(value) <= schema["maxLength"], path


DIAGNOSTIC = Diagnostic(Location("placementmap a/b", 0, 0, "spec.placements[0]"), "x", hint="y")


def test_the_status_the_controller_writes_fits_the_placementmap_schema() -> None:
    status = MapStatus(
        Phase.DEGRADED,
        observed_generation=3,
        observed_version="abc",
        message="1 slot blocked",
        errors=(DIAGNOSTIC,),
        slots=SlotCounts(4, 3, 2, 1, 1, 1, 1),
        serving_version="def",
        warnings=(DIAGNOSTIC,),
        revision="0123abc",
        rollout="evict",
        gang=GangStatus(4, 3, ((3, "DeviceBusy"),), True, 600),
    )
    written = resource_status(
        status, 2, None, "2026-11-26T00:00:00Z", source_file="a.yaml", supersedes="configmap a/b"
    )
    schema = at(root_of(placement_map_crd()), ("status",))
    conforms(written, schema)
    assert set(written) == set(schema["properties"])
    assert set(written["slots"]) == set(schema["properties"]["slots"]["properties"])


def test_the_status_the_controller_writes_fits_the_placementpolicy_schema() -> None:
    obj = {"metadata": {"name": POLICY_CONFIGMAP, "generation": 4}}
    schema = at(root_of(placement_policy_crd()), ("status",))
    for verdict in (PolicyVerdict.valid(obj, 2), PolicyVerdict.invalid(obj, [DIAGNOSTIC])):
        conforms(verdict.resource_status(None, "2026-11-26T00:00:00Z"), schema)


def test_the_converter_refuses_what_a_crd_cannot_say() -> None:
    class Either(BaseModel):
        value: int | float

    with pytest.raises(SchemaError, match="value"):
        structural_schema(Either)


# ------------------------------------------------------------------------------- the command


def test_crds_prints_both_and_check_finds_stale_files(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main(["crds"]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [d["metadata"]["name"] for d in docs] == [
        "placementmaps.gpuplace.io",
        "placementpolicies.gpuplace.io",
    ]
    assert docs == [placement_map_crd(), placement_policy_crd()]
    assert main(["crds", "--check", str(tmp_path)]) == 1
    assert main(["crds", "--write", str(tmp_path)]) == 0
    assert main(["crds", "--check", str(tmp_path)]) == 0
    edited = tmp_path / "placementmaps.gpuplace.io.yaml"
    edited.write_text(edited.read_text().replace(f"maxItems: {MAX_PLACEMENTS}", "maxItems: 7"))
    capsys.readouterr()
    assert main(["crds", "--check", str(tmp_path)]) == 1
    assert "placementmaps.gpuplace.io.yaml: differs" in capsys.readouterr().err
