"""kubeio/shapes.py: a shape builds only the fields it names, of list pages and watch events, and
never loses an object it cannot decode that way."""

from __future__ import annotations

from typing import TypedDict

import orjson
import pytest

from kubeio.shapes import Shape


class _Meta(TypedDict, total=False):
    name: str | None
    labels: dict[str, str] | None


class _Thing(TypedDict, total=False):
    metadata: _Meta | None


SHAPE = Shape(_Thing)
WHOLE = {"metadata": {"name": "a", "labels": {"x": "y"}, "managedFields": [{"f": 1}]}, "spec": {}}


def test_a_page_keeps_its_metadata_and_the_named_fields_of_each_item() -> None:
    body = {"kind": "ThingList", "metadata": {"resourceVersion": "5", "continue": "c"},
            "items": [WHOLE, {"metadata": {"name": "b"}}]}  # fmt: skip
    page = SHAPE.page(orjson.dumps(body))
    assert page == {
        "metadata": {"resourceVersion": "5", "continue": "c"},
        "items": [{"metadata": {"name": "a", "labels": {"x": "y"}}}, {"metadata": {"name": "b"}}],
    }


def test_a_page_without_items_has_an_empty_list() -> None:
    assert SHAPE.page(b'{"metadata":{"resourceVersion":"1"},"items":null}')["items"] == []
    assert SHAPE.page(b'{"metadata":{"resourceVersion":"1"}}')["items"] == []


def test_an_item_of_another_type_than_the_shape_says_keeps_the_whole_page() -> None:
    body = {"metadata": {"resourceVersion": "5"}, "items": [WHOLE, {"metadata": {"name": 7}}]}
    assert SHAPE.page(orjson.dumps(body)) == body


def test_events_of_the_resource_are_shaped_and_the_others_decoded_whole() -> None:
    for kind in ("ADDED", "MODIFIED", "DELETED"):
        event = SHAPE.event(orjson.dumps({"type": kind, "object": WHOLE}))
        assert event == {"type": kind, "object": {"metadata": {"name": "a", "labels": {"x": "y"}}}}
    status = {"kind": "Status", "code": 410, "reason": "Expired"}
    assert SHAPE.event(orjson.dumps({"type": "ERROR", "object": status}))["object"] == status
    bookmark = {"metadata": {"resourceVersion": "9"}}
    assert SHAPE.event(orjson.dumps({"type": "BOOKMARK", "object": bookmark}))["object"] == bookmark
    odd = {"metadata": {"name": ["x"]}}
    assert SHAPE.event(orjson.dumps({"type": "ADDED", "object": odd}))["object"] == odd


def test_an_event_without_an_object_has_an_empty_one_and_a_non_object_is_refused() -> None:
    assert SHAPE.event(b'{"type":"MODIFIED","object":null}') == {"type": "MODIFIED", "object": {}}
    assert SHAPE.event(b'{"type":"ERROR"}') == {"type": "ERROR", "object": {}}
    with pytest.raises(ValueError, match="not a JSON object"):
        SHAPE.event(b"[1]")


@pytest.mark.parametrize("text", [b"not json", b'{"items": [', b"\xff\xfe"])
def test_malformed_json_is_a_value_error(text: bytes) -> None:
    with pytest.raises(ValueError, match="not JSON"):
        SHAPE.page(text)
    with pytest.raises(ValueError, match="not JSON"):
        SHAPE.event(text)
