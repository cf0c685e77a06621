"""Placement-map admission on UPDATE: the map is judged when its text changes, not on every write."""

from __future__ import annotations

import copy
from typing import Any

from placement.annotations import PLACEMENT_KEY, PLACEMENT_MAP_LABEL, STATUS_ANNOTATION
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
