"""The event builder (`placement/yamlevents.py`) reads what the node-tree reader reads, to the
column, or gives up: every stream here is read both ways and the results compared field by field
(types and order included), and every refusal must come out of `load_documents` unchanged."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench._workload import Scale, map_yaml
from bench.mapinput import big_map
from placement.errors import PlacementError
from placement.validate import parse_map
from placement.yamlsource import (
    DEFAULT_LIMITS,
    Document,
    YamlLimits,
    _read_events,
    _read_nodes,
    load_documents,
)

ROOT = Path(__file__).resolve().parents[3]
FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def shape(doc: Document) -> str:
    """Everything a Document holds, in a form where `1`, `1.0` and `True` differ, and so does the
    order of a mapping's keys."""
    return repr((doc.source, doc.value, doc.values, doc.keys, doc.block_scalars, doc.positioned))


def printable(text: str) -> bool:
    """Whether `load_documents` gets past its reader check to parse `text` at all."""
    try:
        yaml.reader.Reader(text)
    except yaml.reader.ReaderError:
        return False
    return True


def read_both(text: str, limits: YamlLimits = DEFAULT_LIMITS) -> list[Document] | None:
    """Reads `text` both ways and fails on any difference; the event builder's documents, or None
    where it gave up."""
    fast = _read_events(text, "t.yaml", limits)
    try:
        slow = _read_nodes(text, "t.yaml", limits)
    except PlacementError as refused:
        assert fast is None, f"the event builder read a stream that is refused: {refused}"
        with pytest.raises(PlacementError) as caught:
            list(load_documents(text, "t.yaml", limits))
        assert caught.value.diagnostics == refused.diagnostics
        return None
    if fast is not None:
        assert [shape(doc) for doc in fast] == [shape(doc) for doc in slow]
    assert [shape(doc) for doc in load_documents(text, "t.yaml", limits)] == [
        shape(doc) for doc in slow
    ]
    return fast


def _test_texts() -> list[str]:
    """The multi-line string constants of the unit tests: maps, policies, legacy lines, and some
    text that is not YAML at all."""
    texts: set[str] = set()
    for module in sorted((ROOT / "tests" / "unit").rglob("*.py")):
        for node in ast.walk(ast.parse(module.read_text())):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and "\n" in node.value.strip()
                and printable(node.value)
            ):
                texts.add(node.value)
    return sorted(texts)


def _repo_yaml() -> list[Path]:
    return sorted(
        path
        for folder in ("examples", "charts", "argocd")
        for pattern in ("*.yaml", "*.yml")
        for path in (ROOT / folder).rglob(pattern)
    )


TEST_TEXTS = _test_texts()
REPO_YAML = _repo_yaml()
SCALE = Scale(nodes=5000, pods=40000, gpus=8, slots_per_map=100)


def test_the_corpus_is_broad() -> None:
    assert len(TEST_TEXTS) > 100
    assert any(path.name == "llm-serving.yaml" for path in REPO_YAML)


@pytest.mark.parametrize("index", range(len(TEST_TEXTS)))
def test_the_unit_tests_texts_read_the_same(index: int) -> None:
    read_both(TEST_TEXTS[index])


@pytest.mark.parametrize("path", REPO_YAML, ids=lambda path: str(path.relative_to(ROOT)))
def test_the_repositorys_yaml_reads_the_same(path: Path) -> None:
    text = path.read_text()
    fast = read_both(text)
    if not any(mark in text for mark in ("&", "*", "!", "<<", "{{")):
        assert fast is not None, "the event builder gave up on a plain stream"


@pytest.mark.parametrize("m", [0, 1, 399])
def test_the_bench_maps_read_the_same(m: int) -> None:
    assert read_both(map_yaml(SCALE, m)) is not None


def test_a_large_flow_map_reads_the_same() -> None:
    (doc,) = read_both(big_map(3000)) or []
    assert len(doc.value["spec"]["placements"]) == 3000
    assert doc.values[("spec", "placements", 2999, "devices", 0)] == (3005, 43)


# Values as a user or a tool writes them; floats without NaN, which equals nothing.
_leaves = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=False)
    | st.text(max_size=12)
    | st.sampled_from(["yes", "no", "on", "~", "0x1f", "0o17", "1_000", "1e3", "2024-01-02", "<<"])
    | st.sampled_from(["=", ".inf", "-.inf", "null", "True", "a: b", "- x", "#c", "line\nline\n"])
    | st.text(alphabet=st.sampled_from("ab \n\t:#-'\"\\é{}[],&*!|>%@`"), max_size=20)
)
_keys = st.text(max_size=8) | st.sampled_from(["<<", "=", "1", "null", "true", "? x", "a b"])
_values = st.recursive(
    _leaves,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_keys, inner, max_size=4),
    max_leaves=25,
)


def _dumper(string_style: str | None) -> type[yaml.SafeDumper]:
    """A SafeDumper that asks for one style for every string; the emitter falls back where the
    style does not fit (a block scalar as a key or inside a flow collection)."""

    class Dumper(yaml.SafeDumper):
        pass

    def represent_str(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
        style = string_style
        if style == "|" and "\n" not in data:
            style = None
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)

    Dumper.add_representer(str, represent_str)
    return Dumper


@st.composite
def streams(draw: st.DrawFn) -> str:
    """Several documents in block, flow or mixed style, with empty documents and comments."""
    parts: list[str] = []
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        kind = draw(st.sampled_from(["value", "empty", "comment"]))
        if kind == "empty":
            parts.append("")
            continue
        text = yaml.dump(
            draw(_values),
            Dumper=_dumper(draw(st.sampled_from([None, "'", '"', "|"]))),
            default_flow_style=draw(st.sampled_from([False, True, None])),
            allow_unicode=draw(st.booleans()),
            sort_keys=draw(st.booleans()),
            indent=draw(st.sampled_from([2, 4])),
            width=draw(st.sampled_from([20, 80])),
        )
        if kind == "comment":
            lines = text.split("\n")
            at = draw(st.integers(min_value=0, max_value=len(lines)))
            lines.insert(at, "# " + draw(st.text(alphabet="abc :-", max_size=10)))
            text = "\n".join(lines)
        parts.append(text)
    if len(parts) == 1 and not draw(st.booleans()):
        return parts[0]
    return "".join(
        f"---\n{part}" if part.endswith("\n") or not part else f"---\n{part}\n" for part in parts
    )


@FUZZ
@given(streams())
def test_dumped_values_read_the_same_and_take_the_event_builder(text: str) -> None:
    try:
        _read_nodes(text, "t.yaml", DEFAULT_LIMITS)
    except PlacementError:
        read_both(text)  # a comment line that ends a block scalar early: refused both ways
        return
    assert read_both(text) is not None, "the event builder gave up on a plain stream"


@FUZZ
@given(st.sampled_from([*TEST_TEXTS, map_yaml(SCALE, 2)]), st.data())
def test_cut_and_spliced_texts_read_the_same(text: str, data: st.DataObject) -> None:
    """A prefix of a text, or a text with a slice of another pasted in: mostly invalid YAML, whose
    refusals must stay those of the node-tree reader."""
    cut = data.draw(st.integers(min_value=0, max_value=len(text)))
    other = data.draw(st.sampled_from(TEST_TEXTS))
    start = data.draw(st.integers(min_value=0, max_value=len(other)))
    paste = other[start : start + data.draw(st.integers(min_value=0, max_value=40))]
    for candidate in (text[:cut], text[:cut] + paste + text[cut:]):
        if printable(candidate):
            read_both(candidate)


HEADER = "apiVersion: gpuplace.io/v1alpha1\nkind: PlacementMap\n"
MAP = HEADER + "metadata: {name: m, namespace: n}\nspec:\n  placements: []\n"


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("a: &x 1\nb: *x\n", id="anchor-and-alias"),
        pytest.param("a: &x 1\n", id="anchor-unused"),
        pytest.param("a: *x\n", id="alias-undefined"),
        pytest.param(
            HEADER + "metadata: &m {name: m, namespace: n}\nspec: {placements: []}\n",
            id="anchor-in-map",
        ),
        pytest.param("a: !!str 1\n", id="tag-str"),
        pytest.param("a: !!int x\n", id="tag-misfit"),
        pytest.param("a: !custom 1\n", id="tag-local"),
        pytest.param("a: ! 1\n", id="tag-nonspecific"),
        pytest.param("!!map {a: 1}\n", id="tag-on-collection"),
        pytest.param("a: !!binary aGk=\n", id="tag-binary"),
        pytest.param("a: {<<: {b: 1}, c: 2}\n", id="merge-key"),
        pytest.param(
            HEADER + "metadata: {name: m, namespace: n}\nspec:\n  <<: {a: 1}\n", id="merge-in-map"
        ),
        pytest.param("a: 1\na: 2\n", id="duplicate-key"),
        pytest.param(MAP + "spec: {}\n", id="duplicate-key-in-map"),
        pytest.param("? [a, b]\n: 1\n", id="complex-key-sequence"),
        pytest.param("? {a: 1}\n: 1\n", id="complex-key-mapping"),
        pytest.param("1: a\n2: b\n", id="int-keys"),
        pytest.param("1: a\n'1': b\n", id="int-and-string-key"),
        pytest.param("true: a\n", id="bool-key"),
        pytest.param(": a\n", id="null-key"),
        pytest.param("=: a\n", id="value-key"),
        pytest.param("a: =\n", id="value-tag"),
        pytest.param("a: <<\n", id="merge-as-value"),
        pytest.param("a: 2024-13-45\n", id="timestamp-misfit"),
        pytest.param("a: " + "9" * 5000 + "\n", id="int-too-long"),
        pytest.param("a: [1, 2\n", id="syntax-error"),
        pytest.param("a: 1\n---\nb: *x\n", id="alias-in-a-later-document"),
        pytest.param("a: 1\n--- |\n  x\n--- [\n", id="syntax-error-in-a-later-document"),
    ],
)
def test_the_event_builder_leaves_these_to_the_node_tree(text: str) -> None:
    assert _read_events(text, "t.yaml", DEFAULT_LIMITS) is None
    read_both(text)


@pytest.mark.parametrize("opening", ["[", "{a: ", "- "])
@pytest.mark.parametrize("levels", [98, 99, 100, 101, 500])
def test_deep_nesting_is_left_to_the_node_tree(opening: str, levels: int) -> None:
    def nested(depth: int) -> str:
        if opening == "- ":
            return "".join(f"{'  ' * i}-\n" for i in range(depth))
        return opening * depth + ("]" if opening == "[" else "}") * depth + "\n"

    limits = YamlLimits(max_depth=100)
    fast = read_both(nested(levels), limits)
    # The builder opens no collection whose contents would be past the limit; at the edge (an
    # empty innermost `[]` at the 100th level is still within it) it leaves the stream to the
    # node tree, which reads it or refuses it.
    assert (fast is not None) == (levels < 100)


def test_the_comparison_sees_a_column_off_by_one() -> None:
    (doc,) = _read_nodes(MAP, "t.yaml", DEFAULT_LIMITS)
    line, column = doc.values[("spec", "placements")]
    moved = Document(doc.source, doc.value, dict(doc.values), doc.keys, doc.block_scalars)
    assert shape(moved) == shape(doc)
    moved.values[("spec", "placements")] = (line, column + 1)
    assert shape(moved) != shape(doc)


def test_block_scalars_keep_their_start_and_indent() -> None:
    text = (
        HEADER
        + "metadata: {name: m, namespace: n}\nspec:\n  map: |\n\n      0=n1:0\n      1=n2:1\n"
    )
    (doc,) = read_both(text) or []
    assert doc.block_scalars == {("spec", "map"): (6, 6)}
    assert parse_map(text, "t.yaml").key.name == "m"


def test_an_empty_document_is_a_null_value_at_its_place() -> None:
    docs = read_both("---\n---\na: 1\n--- # nothing\n...\n") or []
    assert [(doc.value, doc.values) for doc in docs] == [
        (None, {(): (2, 1)}),
        ({"a": 1}, {(): (3, 1), ("a",): (3, 4)}),
        (None, {(): (5, 1)}),
    ]
    assert read_both("") == []
    assert read_both("# only a comment\n") == []
