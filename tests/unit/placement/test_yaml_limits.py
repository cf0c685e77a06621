"""Input that costs nothing to write costs nothing to read: aliases, merge keys, depth, size, and
the length of every message that quotes the input."""

from __future__ import annotations

import gc
import io
import json
import logging
import threading

import pytest

from kubeio.logs import JsonFormatter, TextFormatter
from placement.errors import MAX_DIAGNOSTICS, Diagnostic, Location, PlacementError
from placement.validate import load_maps, parse_map
from placement.yamlsource import YamlLimits, load_documents
from webhook.review import MAX_DENIAL, Verdict

HEADER = """\
apiVersion: gpuplace.io/v1alpha1
kind: PlacementMap
metadata: {name: llm, namespace: inference}
"""


def merge_bomb(levels: int, fan: int = 4, header: str = HEADER) -> str:
    """`a_i` merges `a_{i-1}` `fan` times: fan**levels entries if merges are copied naively."""
    lines = ["a0: &a0 {x: 1, y: 2}"]
    for i in range(1, levels):
        refs = ", ".join([f"*a{i - 1}"] * fan)
        lines.append(f"a{i}: &a{i} {{<<: [{refs}]}}")
    return header + "\n".join(lines) + "\nspec: {placements: []}\n"


def test_the_merge_key_bomb_in_a_map_is_refused_with_one_short_message() -> None:
    text = merge_bomb(12)
    assert len(text) < 600
    result = load_maps(text, "bomb.yaml")
    (diagnostic,) = result.diagnostics
    assert (diagnostic.location.line, diagnostic.location.column) == (4, 5)
    assert diagnostic.message == (
        "YAML anchors are not allowed in a PlacementMap (55 more anchors or aliases in this "
        "document)"
    )
    assert len(diagnostic.format()) < 200


def test_a_merge_key_without_anchors_is_refused_in_a_map_at_its_place() -> None:
    text = HEADER + "spec:\n  <<: {sharing: shared}\n  placements: []\n"
    (diagnostic,) = load_maps(text, "m.yaml").diagnostics
    assert (diagnostic.location.line, diagnostic.location.column) == (5, 3)
    assert "merge keys (<<) are not allowed" in diagnostic.message


def test_an_alias_in_a_map_is_refused() -> None:
    text = HEADER + "spec:\n  placements:\n  - &p {index: 0, node: n1, devices: [0]}\n  - *p\n"
    (diagnostic,) = load_maps(text, "m.yaml").diagnostics
    assert diagnostic.location.line == 6
    assert diagnostic.message.startswith("YAML anchors are not allowed in a PlacementMap")


def test_the_merge_key_bomb_elsewhere_is_read_in_linear_size() -> None:
    # Not a PlacementMap (a Helm values file, say): merges resolve, each merged mapping once.
    result = load_maps(merge_bomb(30, header=""), "values.yaml")
    assert (result.maps, result.diagnostics, result.other_documents) == ([], [], 1)
    (doc,) = load_documents(merge_bomb(30, header=""), "values.yaml")
    assert doc.value["a29"] == {"x": 1, "y": 2}


def test_merge_keys_outside_maps_follow_yaml_merge_semantics() -> None:
    text = (
        "base: &base {a: 1, b: 1}\n"
        "other: &other {b: 2, c: 2}\n"
        "both: {<<: [*base, *other], a: 0}\n"
        "one: {<<: *other}\n"
    )
    (doc,) = load_documents(text, "v.yaml")
    assert doc.value["both"] == {"a": 0, "b": 1, "c": 2}
    assert doc.value["one"] == {"b": 2, "c": 2}


def test_merges_that_copy_too_much_are_refused() -> None:
    wide = "w: &w {" + ", ".join(f"k{i}: {i}" for i in range(100)) + "}\n"
    text = wide + "".join(f"m{i}: {{<<: [*w, *w, *w]}}\n" for i in range(20))
    limits = YamlLimits(max_merged=1000)
    with pytest.raises(PlacementError) as caught:
        list(load_documents(text, "v.yaml", limits))
    (diagnostic,) = caught.value.diagnostics
    assert diagnostic.message == "YAML merge keys copy more than 1000 entries"


def test_a_merge_key_takes_mappings_only() -> None:
    with pytest.raises(PlacementError) as caught:
        list(load_documents("a: {<<: [1, 2]}\n", "v.yaml"))
    assert caught.value.diagnostics[0].message == (
        "a merge key (<<) takes a mapping or a list of mappings"
    )


def test_a_complex_key_is_not_constructed() -> None:
    # PyYAML would construct the key mapping, merges and all, before we could refuse it.
    text = "x: &x {a: 1}\n? {<<: [*x, *x]}\n: 1\n"
    with pytest.raises(PlacementError) as caught:
        list(load_documents(text, "v.yaml"))
    assert caught.value.diagnostics[0].message == "mapping keys must be plain scalars"


@pytest.mark.parametrize("opening", ["[", "{a: ", "- "])
def test_nesting_is_bounded(opening: str) -> None:
    deep = opening * 500 if opening != "- " else "".join(f"{' ' * 2 * i}-\n" for i in range(500))
    with pytest.raises(PlacementError) as caught:
        list(load_documents(deep, "deep.yaml"))
    (diagnostic,) = caught.value.diagnostics
    assert diagnostic.message == "YAML nests deeper than 100 levels"


def test_size_is_bounded() -> None:
    with pytest.raises(PlacementError) as caught:
        list(load_documents("a: " + "x" * 200 + "\n", "big.yaml", YamlLimits(max_bytes=100)))
    assert caught.value.diagnostics[0].message == "the YAML is 204 bytes; the limit is 100"
    # Counted in bytes, not characters.
    with pytest.raises(PlacementError):
        list(load_documents("a: " + "é" * 60 + "\n", "big.yaml", YamlLimits(max_bytes=100)))


def test_a_large_valid_map_is_read_whole() -> None:
    entries = "".join(
        f"  - {{index: {i}, node: gpu-node-{i // 8}, devices: [{i % 8}]}}\n" for i in range(3000)
    )
    pmap = parse_map(HEADER + "spec:\n  placements:\n" + entries, "big.yaml")
    assert len(pmap.slots) == 3000
    assert pmap.slots[-1].node == "gpu-node-374"


def test_reading_leaves_the_garbage_collector_as_it_was() -> None:
    assert gc.isenabled()
    errors: list[BaseException] = []

    def read() -> None:
        try:
            for _ in range(20):
                load_maps(HEADER + "spec: {placements: [{index: 0, node: n, devices: [0]}]}\n", "m")
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=read) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert gc.isenabled()


def test_messages_are_capped_where_they_are_shown() -> None:
    diagnostic = Diagnostic(Location("m.yaml", 1, 1, "spec." + "x" * 1000), "bad " * 10_000)
    assert len(diagnostic.format()) < 800
    assert len(json.dumps(diagnostic.to_json())) < 1000
    assert diagnostic.format().endswith("more characters)")
    many = PlacementError(tuple(Diagnostic(Location("m.yaml", i, 1), "bad") for i in range(999)))
    assert len(many.diagnostics) == MAX_DIAGNOSTICS
    assert many.diagnostics[-1].message == "950 more problems not shown"


def test_a_denial_is_capped() -> None:
    verdict = Verdict.deny("x" * 100_000, warnings=["w" * 10_000])
    assert len(verdict.message) <= MAX_DENIAL + 40
    assert all(len(w) < 600 for w in verdict.warnings)


@pytest.mark.parametrize("formatter", [TextFormatter(), JsonFormatter()])
def test_log_lines_are_capped(formatter: logging.Formatter) -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter)
    logger = logging.getLogger("test_yaml_limits.capped")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("map refused: %s", "y" * 1_000_000, extra={"pod": "p" * 1_000_000})
    finally:
        logger.removeHandler(handler)
    assert len(stream.getvalue()) < 10_000
    assert "more characters)" in stream.getvalue()


def test_the_placement_policy_refuses_aliases_too() -> None:
    text = "apiVersion: gpuplace.io/v1alpha1\nkind: PlacementPolicy\nx: &a [1]\ny: *a\n"
    with pytest.raises(PlacementError) as caught:
        list(load_documents(text, "policy.yaml"))
    (diagnostic,) = caught.value.diagnostics
    assert diagnostic.message == (
        "YAML anchors are not allowed in a PlacementPolicy (1 more anchors or aliases in this "
        "document)"
    )
