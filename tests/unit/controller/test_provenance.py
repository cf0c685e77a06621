"""Provenance stamped on source maps and Bindings: the codec."""

from __future__ import annotations

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
