"""docs/reference is what its generator (`python -m gpuplace_dev.docsref`, `make docs-ref`) writes
from the parser, the chart's values schema and the CRD models now: a changed flag, value or CRD
field fails here until the references are regenerated."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuplace_dev import docsref
from placement.crd import all_crds

REPO = Path(__file__).resolve().parents[3]
REFERENCE = REPO / "docs" / "reference"


def test_checked_in_references_match_the_generator() -> None:
    assert docsref.stale_files(REFERENCE) == [], "docs/reference is stale: run make docs-ref"


def test_a_stale_or_missing_reference_fails_the_check(tmp_path: Path) -> None:
    assert docsref.main(["--write", str(tmp_path)]) == 0
    assert docsref.main(["--check", str(tmp_path)]) == 0
    (tmp_path / "values.md").write_text((tmp_path / "values.md").read_text() + "edited\n")
    (tmp_path / "crds.md").unlink()
    assert docsref.stale_files(tmp_path) == ["values.md", "crds.md"]
    assert docsref.main(["--check", str(tmp_path)]) == 1


def test_the_cli_reference_has_every_product_command_and_no_development_one() -> None:
    text = docsref.cli_reference()
    for command in ("controller", "webhook", "agent", "validate", "diff", "render", "gpus"):
        assert f"## `gpuplace {command}`" in text
    assert "### `gpuplace key rotate`" in text
    assert "`gpuplace cluster`" not in text.split("## `gpuplace agent`")[1]
    assert "## `gpuplace demo`" not in text
    assert "| `--kubeconfig KUBECONFIG` | `KUBECONFIG` |" in text


def test_the_cli_reference_does_not_read_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    before = docsref.cli_reference()
    monkeypatch.setenv("GPUPLACE_AGENT_INTERVAL", "99")
    monkeypatch.setenv("NODE_NAME", "somewhere")
    assert docsref.cli_reference() == before


def test_the_values_reference_has_every_value_of_the_schema() -> None:
    schema = json.loads((REPO / "charts" / "gpuplace" / "values.schema.json").read_text())
    text = docsref.values_reference()

    def leaves(node: dict[str, object], path: str) -> list[str]:
        properties = node.get("properties")
        if not isinstance(properties, dict):
            return [path]
        return [leaf for k, v in properties.items() for leaf in leaves(v, f"{path}.{k}".strip("."))]

    for value in leaves(schema, ""):
        assert f"| `{value}` |" in text, value


def test_the_crd_reference_has_every_field_of_each_crd() -> None:
    text = docsref.crds_reference()
    for crd in all_crds():
        assert f"## {crd['spec']['names']['kind']}" in text
        schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        for key in schema["properties"]["spec"]["properties"]:
            assert f"| `spec.{key}` |" in text, key


def test_a_pipe_in_a_code_cell_does_not_split_the_row() -> None:
    assert docsref._cell("`a|b` or c|d") == "<code>a&#124;b</code> or c\\|d"
