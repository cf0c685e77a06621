"""The PlacementMap custom resource form on the command line: `render --as crd`, `migrate`, and
`validate`/`diff` reading maps kept as rendered ConfigMaps."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import git
import pytest
import yaml

from gpuplace.cli import main
from gpuplace_dev.localcluster import find_binaries
from placement.annotations import ORIGIN_ANNOTATION, source_provenance

ROOT = Path(__file__).resolve().parents[3]
GITOPS = ROOT / "examples" / "gitops"
DEV = GITOPS / "clusters" / "dev"
PROD = GITOPS / "clusters" / "prod"

Doc = dict[str, Any]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def by_key(docs: list[Doc]) -> dict[tuple[str, str], Doc]:
    return {(d["metadata"]["namespace"], d["metadata"]["name"]): d for d in docs}


def kustomize(directory: Path) -> list[Doc]:
    built = subprocess.run(
        [str(find_binaries().kubectl), "kustomize", str(directory)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return list(yaml.safe_load_all(built))


@pytest.fixture
def dev(tmp_path: Path) -> Path:
    """A copy of examples/gitops/clusters/dev (the ConfigMap form)."""
    copy = tmp_path / "dev"
    shutil.copytree(DEV, copy)
    return copy


# -- render --as crd ------------------------------------------------------------------------------
def test_render_as_crd_prints_each_map_as_the_document_in_git(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run(capsys, "render", "--as", "crd", "--revision", "c0ffee", str(PROD))
    assert code == 0
    docs = by_key(list(yaml.safe_load_all(out)))
    assert set(docs) == {("inference", "llm-serving"), ("ml-training", "pretraining")}
    for (_, name), doc in docs.items():
        written = yaml.safe_load((PROD / "maps" / f"{name}.yaml").read_text())
        assert (doc["apiVersion"], doc["kind"]) == ("gpuplace.io/v1alpha1", "PlacementMap")
        assert doc["spec"] == written["spec"]
        assert doc["metadata"] == {
            **written["metadata"],
            "annotations": {
                "gpuplace.io/revision": "c0ffee",
                "gpuplace.io/source-file": f"maps/{name}.yaml",
            },
        }


def test_render_as_crd_is_what_the_prod_kustomization_applies(
    capsys: pytest.CaptureFixture[str],
) -> None:
    applied = [d for d in kustomize(PROD) if d["kind"] == "PlacementMap"]
    code, out, _ = run(capsys, "render", "--as", "crd", str(PROD))
    assert code == 0
    rendered = by_key(list(yaml.safe_load_all(out)))
    assert set(by_key(applied)) == set(rendered)
    for key, doc in by_key(applied).items():
        # kustomize names the file in its origin annotation; render stamps gpuplace.io/source-file:
        # the controller reads the same file from either.
        annotations = doc["metadata"].pop("annotations")
        stamped = rendered[key]["metadata"].pop("annotations")
        assert source_provenance(annotations) == source_provenance(stamped)
        assert ORIGIN_ANNOTATION in annotations
        assert doc == rendered[key]


def test_render_as_configmap_stays_the_default(capsys: pytest.CaptureFixture[str]) -> None:
    _, default, _ = run(capsys, "render", str(DEV))
    _, explicit, _ = run(capsys, "render", "--as", "configmap", str(DEV))
    assert default == explicit
    assert {d["kind"] for d in yaml.safe_load_all(default)} == {"ConfigMap"}


# -- migrate ----------------------------------------------------------------------------------------
def test_migrate_turns_the_dev_generators_into_resources(
    dev: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    maps_before = {p.name: p.read_bytes() for p in (dev / "maps").iterdir()}
    _, configmaps_before, _ = run(capsys, "render", str(dev))
    code, out, err = run(capsys, "migrate", str(dev))
    assert (code, out) == (0, "")
    assert "Converted" in err and "5 map(s) as PlacementMap resources" in err
    kustomization = yaml.safe_load((dev / "kustomization.yaml").read_text())
    assert kustomization["resources"] == [
        "namespaces.yaml",
        "maps/llm-serving.yaml",
        "maps/embeddings.yaml",
        "maps/trainer.yaml",
        "maps/notebooks.yaml",
        "maps/webhook-test.yaml",
    ]
    assert kustomization["buildMetadata"] == ["originAnnotations"]
    assert "configMapGenerator" not in kustomization and "generatorOptions" not in kustomization
    # The map files are untouched; validate and render read the same maps as before.
    assert {p.name: p.read_bytes() for p in (dev / "maps").iterdir()} == maps_before
    code, out, _ = run(capsys, "validate", str(dev))
    assert code == 0 and out.startswith("OK: 5 valid maps")
    assert "warning" not in out
    _, configmaps_after, _ = run(capsys, "render", str(dev))
    assert configmaps_after == configmaps_before
    # kustomize applies them as PlacementMaps, each naming its file.
    applied = [d for d in kustomize(dev) if d["kind"] == "PlacementMap"]
    assert len(applied) == 5
    assert all(
        source_provenance(d["metadata"]["annotations"])[1].startswith("maps/") for d in applied
    )
    # Once converted, nothing is left to convert.
    code, _, err = run(capsys, "migrate", str(dev))
    assert code == 0 and "nothing to convert" in err


def test_migrate_dry_run_prints_and_writes_nothing(
    dev: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = (dev / "kustomization.yaml").read_text()
    code, out, err = run(capsys, "migrate", "--dry-run", str(dev))
    assert code == 0
    assert (dev / "kustomization.yaml").read_text() == before
    assert yaml.safe_load(out)["buildMetadata"] == ["originAnnotations"]
    assert out.startswith("# The dev cluster:")  # the leading comments are kept
    assert err.startswith(f"Would convert {(dev / 'kustomization.yaml').as_posix()}: 5 map(s)")
    assert "  - configMapGenerator entry trainer (ConfigMap ml-training/trainer)" in err
    assert "  - generatorOptions (no generator is left)" in err


KUSTOMIZATION = """\
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
generatorOptions:
  disableNameSuffixHash: true
  labels:
    gpuplace.io/placement-map: "true"
configMapGenerator:
  - name: llm-serving
    namespace: inference
    files:
      - placement.yaml=maps/llm-serving.yaml
    options:
      labels:
        team: serving
  - name: settings
    namespace: inference
    literals:
      - mode=fast
patches:
  - target:
      kind: ConfigMap
      labelSelector: gpuplace.io/placement-map=true
    patch: |-
      - op: add
        path: /metadata/annotations/x
        value: y
  - target:
      kind: ConfigMap
    patch: |-
      - op: add
        path: /metadata/annotations/z
        value: y
  - path: llm-patch.yaml
  - target:
      kind: Deployment
      name: web
    patch: |-
      - op: add
        path: /metadata/annotations/z
        value: y
"""


def test_migrate_keeps_what_is_not_about_the_maps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "maps").mkdir()
    shutil.copy(DEV / "maps" / "llm-serving.yaml", tmp_path / "maps")
    (tmp_path / "kustomization.yaml").write_text(KUSTOMIZATION)
    (tmp_path / "llm-patch.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: llm-serving\n  namespace: inference\n"
        "  annotations: {a: b}\n"
    )
    code, _, err = run(capsys, "migrate", str(tmp_path))
    assert code == 0, err
    result = yaml.safe_load((tmp_path / "kustomization.yaml").read_text())
    # The other generator stays, and with it the options it needs, less the maps' label.
    assert result["configMapGenerator"] == [
        {"name": "settings", "namespace": "inference", "literals": ["mode=fast"]}
    ]
    assert result["generatorOptions"] == {"disableNameSuffixHash": True}
    assert result["resources"] == ["maps/llm-serving.yaml"]
    # The patches of the map ConfigMaps go; the others stay.
    assert [p.get("target", {}).get("kind") for p in result["patches"]] == [
        "ConfigMap",
        "Deployment",
    ]
    assert "labelSelector" not in result["patches"][0]["target"]
    assert "  - patches[0] (it patched map ConfigMaps)" in err
    assert "  - patches[2] (it patched map ConfigMaps)" in err
    assert "note: patches[1] patches ConfigMaps without naming them" in err
    assert "note: the labels team of ConfigMap inference/llm-serving are not carried over" in err
    assert (tmp_path / "llm-patch.yaml").exists()  # files are left alone
    code, out, _ = run(capsys, "validate", str(tmp_path))
    assert code == 0, out


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            ("    namespace: inference\n    files:", "    namespace: serving\n    files:"),
            "kustomization.yaml:9:16: error: configMapGenerator[0].namespace: ConfigMap namespace "
            "'serving' differs",
        ),
        (
            ("configMapGenerator:", "namePrefix: dev-\nconfigMapGenerator:"),
            "kustomization.yaml:7:13: error: namePrefix: kustomize renames",
        ),
        (
            (
                "    namespace: inference\n    files:",
                "    namespace: inference\n    behavior: merge\n    files:",
            ),
            "kustomization.yaml:10:15: error: configMapGenerator[0].behavior: ConfigMap "
            "llm-serving is merged into a base's ConfigMap",
        ),
        (
            (
                "      - placement.yaml=maps/llm-serving.yaml\n",
                "      - placement.yaml=maps/llm-serving.yaml\n      - other.yaml\n",
            ),
            # What `gpuplace validate` says first.
            "kustomization.yaml:11:9: error: configMapGenerator[0].files[0]: a source ConfigMap "
            "holds exactly one map, in one file",
        ),
    ],
)
def test_migrate_refuses_what_it_cannot_convert(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    change: tuple[str, str],
    expected: str,
) -> None:
    (tmp_path / "maps").mkdir()
    shutil.copy(DEV / "maps" / "llm-serving.yaml", tmp_path / "maps")
    (tmp_path / "other.yaml").write_text("a: b\n")
    text = KUSTOMIZATION.split("patches:", maxsplit=1)[0].replace(
        "  - name: settings", "  - name: x"
    )
    assert change[0] in text
    (tmp_path / "kustomization.yaml").write_text(text.replace(*change))
    code, out, err = run(capsys, "migrate", str(tmp_path))
    assert (code, out) == (1, "")
    assert f"{tmp_path.as_posix()}/{expected}" in err, err
    assert err.rstrip().endswith("cannot be migrated as it is.")
    assert (tmp_path / "kustomization.yaml").read_text() == text.replace(*change)


def test_migrate_refuses_a_directory_without_kustomization_or_valid_maps(
    tmp_path: Path, dev: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(capsys, "migrate", str(tmp_path / "nope"))
    assert code == 1 and "nope: error: no such directory" in err
    code, _, err = run(capsys, "migrate", str(dev / "maps"))
    assert code == 1 and "maps: error: no kustomization.yaml here" in err
    text = (dev / "maps" / "trainer.yaml").read_text()
    (dev / "maps" / "trainer.yaml").write_text(text.replace("count: 1", "count: 0", 1))
    code, _, err = run(capsys, "migrate", str(dev))
    assert code == 1 and "trainer.yaml:" in err and "count" in err


# -- maps kept as rendered ConfigMaps -----------------------------------------------------------------
def rendered_dev(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    code, out, _ = run(capsys, "render", str(DEV))
    assert code == 0
    path = tmp_path / "rendered.yaml"
    path.write_text(out)
    return path


def test_validate_reads_maps_kept_as_rendered_configmaps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = rendered_dev(tmp_path, capsys)
    code, out, _ = run(capsys, "validate", str(path))
    assert (code, out) == (0, "OK: 5 valid maps (13 slots) in 1 file.\n")
    # Render reads them back: the same ConfigMaps (and the same custom resources) again.
    code, again, _ = run(capsys, "render", str(path))
    assert code == 0
    originals = by_key(list(yaml.safe_load_all(path.read_text())))
    for key, doc in by_key(list(yaml.safe_load_all(again))).items():
        assert doc["data"] == originals[key]["data"]


def line_of(text: str, needle: str) -> tuple[int, int]:
    for number, line in enumerate(text.splitlines(), start=1):
        if needle in line:
            return number, line.index(needle) + 1
    raise AssertionError(needle)


def test_errors_in_a_rendered_configmap_point_at_its_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = rendered_dev(tmp_path, capsys)
    text = path.read_text().replace("devices: [2, 3]", "devices: [2, 2]", 1)
    text = text.replace("name: trainer\n  namespace", "name: trainer2\n  namespace", 1)
    text = text.replace("    gpuplace.io/placement-map: 'true'\n", "", 1)
    text = text.replace("1=node2:2", "1=node2:two", 1)  # the earlier tools' text in `map: |`
    path.write_text(text)
    code, out, _ = run(capsys, "validate", str(path))
    assert code == 1
    line, column = line_of(text, "devices: [2, 2]")
    shown = path.as_posix()
    assert (
        f"{shown}:{line}:{column + 13}: error: spec.placements[0].devices[1]: device 2 listed "
        f"twice in this entry (first at line {line}, column {column + 10})"
    ) in out
    assert (
        "error: metadata: map declares ml-training/trainer but is stored in ConfigMap "
        "ml-training/trainer2"
    ) in out
    assert 'warning: metadata: ConfigMap lacks the label gpuplace.io/placement-map: "true"' in out
    line, column = line_of(text, "1=node2:two")
    assert f"{shown}:{line}:{column + 8}: error: spec.map: device 'two' is neither" in out


def test_diff_reads_either_form_and_sees_no_change_between_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    top = tmp_path / "repo"
    shutil.copytree(DEV, top / "clusters" / "dev")
    with git.Repo.init(top) as repo:
        actor = git.Actor("Reviewer", "reviewer@example.com")
        repo.git.add(A=True)
        repo.index.commit("map files", author=actor, committer=actor)
        code, out, _ = run(capsys, "render", str(top / "clusters" / "dev"))
        shutil.rmtree(top / "clusters" / "dev" / "maps")
        (top / "clusters" / "dev" / "rendered.yaml").write_text(out)
        code, out, _ = run(capsys, "diff", "HEAD", "--repo", str(top), "--format", "json")
    assert code == 0, out
    assert yaml.safe_load(out)["maps"] == []
