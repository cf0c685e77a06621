"""Placement-map admission on UPDATE: the map is judged when its text changes, not on every write."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from placement import validate
from placement.annotations import PLACEMENT_KEY, PLACEMENT_MAP_LABEL, STATUS_ANNOTATION
from placement.validate import MAX_MAP_BYTES
from tests.unit.webhook_builders import make_configmap, placement_yaml, review
from webhook.mapcheck import check_configmap
from webhook.review import parse_review

INVALID = "spec: ["


def _check(obj: dict[str, Any], old: dict[str, Any] | None) -> bool:
    request = parse_review(
        review(obj, operation="UPDATE", kind="ConfigMap", resource="configmaps", old=old)
    )
    return check_configmap(request).allowed


def _with_status(obj: dict[str, Any]) -> dict[str, Any]:
    updated = copy.deepcopy(obj)
    updated["metadata"]["annotations"] = {STATUS_ANNOTATION: '{"phase": "Invalid"}'}
    return updated


def test_a_metadata_only_update_is_not_judged_again() -> None:
    # A map that got in while the webhook was down: its status must still be writable.
    old = make_configmap("llm", INVALID)
    assert _check(_with_status(old), old)


def test_a_changed_text_is_judged() -> None:
    old = make_configmap("llm", placement_yaml())
    assert not _check(make_configmap("llm", INVALID), old)
    assert _check(make_configmap("llm", placement_yaml(devices="[3]")), old)


def test_a_configmap_that_becomes_a_placement_map_is_judged() -> None:
    old = make_configmap("llm", INVALID, labelled=False)
    assert not _check(make_configmap("llm", INVALID), old)


def test_an_update_without_old_object_is_judged() -> None:
    assert not _check(make_configmap("llm", INVALID), None)
    obj = make_configmap("llm", INVALID)
    assert obj["metadata"]["labels"] == {PLACEMENT_MAP_LABEL: "true"}
    assert obj["data"] == {PLACEMENT_KEY: INVALID}


def big_map(placements: int) -> str:
    """A valid map of `placements` entries on one node: about 45 bytes each."""
    head = placement_yaml().split("spec:")[0]
    rows = "".join(
        f"    - {{index: {i}, node: gpu-{i // 8}, devices: [{i % 8}]}}\n" for i in range(placements)
    )
    return f"{head}spec:\n  placements:\n{rows}"


def test_a_map_larger_than_a_configmap_can_hold_is_refused_before_it_is_parsed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    text = big_map(40_000)
    assert len(text) > MAX_MAP_BYTES

    def never(*_args: Any, **_kwargs: Any) -> None:
        raise AssertionError("an oversized map was parsed")

    monkeypatch.setattr(validate, "parse_map", never)
    request = parse_review(
        review(
            make_configmap("llm", text), operation="CREATE", kind="ConfigMap", resource="configmaps"
        )
    )
    verdict = check_configmap(request)
    assert not verdict.allowed
    assert f"more than a ConfigMap can hold ({MAX_MAP_BYTES} bytes)" in verdict.message
    assert "placement.yaml:1:1" in verdict.message


def test_a_map_just_under_the_limit_is_read() -> None:
    text = big_map(2_000)
    assert len(text) < MAX_MAP_BYTES
    request = parse_review(
        review(
            make_configmap("llm", text), operation="CREATE", kind="ConfigMap", resource="configmaps"
        )
    )
    assert check_configmap(request).allowed
