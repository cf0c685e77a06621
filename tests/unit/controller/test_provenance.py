"""Provenance stamped on source maps: the codec, and the git source's stamps and broken files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from controller.changes import Change, SourceChanged, SourceDeleted
from controller.gitsource import GitSource, map_objects
from controller.settings import GitSourceSettings
from placement.annotations import (
    ORIGIN_ANNOTATION,
    REVISION_ANNOTATION,
    SOURCE_FILE_ANNOTATION,
    SOURCE_PATH_ANNOTATION,
    BindingDecision,
    decode_binding,
    encode_binding,
    source_provenance,
)
from placement.types import GpuUuid, MapKey, NodeName

MAP = """\
apiVersion: gpuplace.io/v1alpha1
kind: PlacementMap
metadata:
  name: {name}
  namespace: ml
spec:
  placements: [{{index: 0, node: gpu-1, devices: [0]}}]
"""


def test_source_provenance_joins_the_application_path_and_the_file() -> None:
    stamps = {
        REVISION_ANNOTATION: "abc123",
        SOURCE_PATH_ANNOTATION: "clusters/dev/",
        SOURCE_FILE_ANNOTATION: "./maps/llm.yaml",
    }
    assert source_provenance(stamps) == ("abc123", "clusters/dev/maps/llm.yaml")
    assert source_provenance({SOURCE_PATH_ANNOTATION: "clusters/dev"}) == ("", "clusters/dev")
    assert source_provenance({SOURCE_FILE_ANNOTATION: "maps/x.yaml"}) == ("", "maps/x.yaml")
    assert source_provenance({}) == ("", "")


def test_a_resource_without_a_stamped_file_names_the_file_kustomize_read_it_from() -> None:
    """A PlacementMap listed under `resources:` of a kustomization with `buildMetadata:
    [originAnnotations]` carries config.kubernetes.io/origin, its path relative to the directory
    built (the Application's path), as `kubectl kustomize` writes it."""
    stamps = {
        REVISION_ANNOTATION: "abc123",
        SOURCE_PATH_ANNOTATION: "examples/gitops/clusters/prod",
        ORIGIN_ANNOTATION: "path: maps/llm-serving.yaml\n",
    }
    assert source_provenance(stamps) == (
        "abc123",
        "examples/gitops/clusters/prod/maps/llm-serving.yaml",
    )
    # A file of a base beside the directory built; and no Application path (kubectl apply -k).
    base = {SOURCE_PATH_ANNOTATION: "clusters/prod", ORIGIN_ANNOTATION: "path: ../base/m.yaml\n"}
    assert source_provenance(base) == ("", "clusters/base/m.yaml")
    assert source_provenance({ORIGIN_ANNOTATION: "path: './maps/a.yaml'\n"}) == ("", "maps/a.yaml")
    # A remote base: the repository and the path in it, in kustomize's own notation.
    remote = "repo: https://github.com/acme/maps\nref: v1\npath: clusters/x/m.yaml\n"
    assert source_provenance({SOURCE_PATH_ANNOTATION: "c", ORIGIN_ANNOTATION: remote}) == (
        "",
        "https://github.com/acme/maps//clusters/x/m.yaml",
    )
    # The stamped file wins; a generated object's origin names no file; junk names none either.
    both = {**stamps, SOURCE_FILE_ANNOTATION: "maps/x.yaml"}
    assert source_provenance(both) == ("abc123", "examples/gitops/clusters/prod/maps/x.yaml")
    generated = (
        "configuredIn: kustomization.yaml\nconfiguredBy:\n  apiVersion: builtin\n"
        "  kind: ConfigMapGenerator\n  path: nested\n"
    )
    assert source_provenance({SOURCE_PATH_ANNOTATION: "c", ORIGIN_ANNOTATION: generated}) == (
        "",
        "c",
    )
    assert source_provenance({ORIGIN_ANNOTATION: "{not: kustomize}"}) == ("", "")


def test_binding_provenance_round_trips_and_is_optional() -> None:
    decision = BindingDecision(
        MapKey("ml", "llm"), 0, NodeName("gpu-1"), (GpuUuid("GPU-1"),), "0", 3, "abc", "m.yaml"
    )
    assert decode_binding("ml", encode_binding(decision)) == decision
    plain = BindingDecision(MapKey("ml", "llm"), 0, NodeName("gpu-1"), (), "0", 3)
    assert REVISION_ANNOTATION not in encode_binding(plain)
    assert decode_binding("ml", encode_binding(plain)) == plain


def test_git_source_stamps_commit_and_file(tmp_path: Path) -> None:
    (tmp_path / "maps").mkdir()
    (tmp_path / "maps" / "a.yaml").write_text(MAP.format(name="a"))
    found, broken = map_objects(tmp_path / "maps", "c0ffee", tmp_path)
    annotations = found[("ml", "a")]["metadata"]["annotations"]
    assert annotations == {REVISION_ANNOTATION: "c0ffee", SOURCE_FILE_ANNOTATION: "maps/a.yaml"}
    assert broken == {}


def test_a_file_that_stops_parsing_keeps_its_maps_invalid_not_deleted(tmp_path: Path) -> None:
    emitted: list[tuple[str, Any]] = []

    def emit(change: Change) -> None:
        assert isinstance(change, SourceChanged | SourceDeleted)
        kind = "source-deleted" if isinstance(change, SourceDeleted) else "source"
        emitted.append((kind, change.obj))

    source = GitSource(GitSourceSettings(), emit)
    (tmp_path / "a.yaml").write_text(MAP.format(name="a"))
    (tmp_path / "b.yaml").write_text(MAP.format(name="b"))
    source._publish(tmp_path, "c1", tmp_path)
    assert sorted(kind for kind, _ in emitted) == ["source", "source"]
    emitted.clear()
    (tmp_path / "a.yaml").write_text(MAP.format(name="a").replace("spec:", "spec: [unclosed"))
    (tmp_path / "b.yaml").unlink()
    source._publish(tmp_path, "c2", tmp_path)
    by_name = {obj["metadata"]["name"]: (kind, obj) for kind, obj in emitted}
    assert by_name["b"][0] == "source-deleted"  # its file is gone: deleted
    kind, obj = by_name["a"]
    assert kind == "source"  # its file does not parse: the broken text, to be judged Invalid
    assert "[unclosed" in obj["data"]["placement.yaml"]
