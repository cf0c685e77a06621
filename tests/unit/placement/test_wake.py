"""Wake keys: one constructor per kind, one text form, parsed back to the same key."""

from __future__ import annotations

import pytest

from placement.types import MapKey, SlotKey
from placement.wake import WakeKey, WakeKind

MAP = MapKey("team", "llm")

CASES = [
    (WakeKey.model(), WakeKind.MODEL, "model", ""),
    (WakeKey.nodes(), WakeKind.NODES, "nodes", ""),
    (WakeKey.node("gpu-1"), WakeKind.NODE, "node:gpu-1", "gpu-1"),
    (WakeKey.slot(SlotKey(MAP, 3)), WakeKind.SLOT, "slot:team/llm[3]", "team/llm[3]"),
    (WakeKey.map(MAP), WakeKind.MAP, "map:team/llm", "team/llm"),
    (WakeKey.inventory("gpu-1"), WakeKind.INVENTORY, "inventory:gpu-1", "gpu-1"),
    (WakeKey.gpu("gpu-1", "GPU-abc"), WakeKind.GPU, "gpu:gpu-1/GPU-abc", "gpu-1/GPU-abc"),
    (WakeKey.gpu("gpu-1", "#2"), WakeKind.GPU, "gpu:gpu-1/#2", "gpu-1/#2"),
    (WakeKey.pod("u-1"), WakeKind.POD, "pod:u-1", "u-1"),
    (WakeKey.claim("u-1"), WakeKind.CLAIM, "claim:u-1", "u-1"),
    (WakeKey.lease(), WakeKind.LEASE, "lease", ""),
]


@pytest.mark.parametrize(("key", "kind", "text", "subject"), CASES, ids=[c[2] for c in CASES])
def test_each_kind_has_one_text_form_that_parses_back(
    key: WakeKey, kind: WakeKind, text: str, subject: str
) -> None:
    assert isinstance(key, WakeKey)
    assert key == text and hash(key) == hash(text)
    assert (key.kind, key.subject) == (kind, subject)
    assert WakeKey(text) == key and type(WakeKey(text)) is WakeKey


def test_every_kind_has_a_constructor_case() -> None:
    assert {kind for _, kind, _, _ in CASES} == set(WakeKind)


def test_a_waiter_and_a_waker_meet_on_equal_keys() -> None:
    waiting = {WakeKey.slot(SlotKey(MAP, 0)), WakeKey.model()}
    assert WakeKey.slot(SlotKey(MAP, 0)) in waiting
    assert WakeKey.slot(SlotKey(MAP, 1)) not in waiting
    assert WakeKey.map(MAP) not in waiting


@pytest.mark.parametrize(
    "text", ["", "modle", "model:x", "nodes:x", "node", "node:", "slots:a/b[0]", "gpu", ":x"]
)
def test_text_that_is_not_a_key_is_refused_with_the_text(text: str) -> None:
    with pytest.raises(ValueError, match="is not a wake key"):
        WakeKey(text)
