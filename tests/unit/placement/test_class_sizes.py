"""No product class grows past a screenful of screens: each concern gets a room of its own."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PRODUCT = ("placement", "kubeio", "controller", "webhook", "agent", "gpuplace")
LIMIT = 350


def class_spans(source: str) -> list[tuple[str, int, int]]:
    """Every class in `source` (nested ones too) with its first and last line."""
    tree = ast.parse(source)
    spans = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            spans.append((node.name, first, node.end_lineno or node.lineno))
    return spans


def oversized(limit: int = LIMIT) -> list[str]:
    found = []
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*.py")):
            for name, first, last in class_spans(path.read_text()):
                if last - first + 1 > limit:
                    where = path.relative_to(ROOT)
                    found.append(f"{where}: class {name} spans {last - first + 1} lines")
    return found


def test_span_counts_from_class_line_to_last_line() -> None:
    source = "x = 1\n\n@decorated\nclass A:\n    a = 1\n\n    def f(self) -> None:\n        pass\n"
    assert class_spans(source) == [("A", 3, 8)]


def test_no_product_class_over_the_limit() -> None:
    assert oversized() == []
