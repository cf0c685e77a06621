"""The one reader of the stored model (controller, webhook, agents): one answer for each state the
ConfigMaps can be in, a half-written model never read as a smaller one."""

from __future__ import annotations

from typing import Any

import pytest

from placement.model import MANIFEST_NAME, SHARD_KEY, Model, encode_model, model_data, read_model
from tests.unit.webhook.test_webhook_review import model_of

OLD, NEW = encode_model(model_of(1, 3)), encode_model(model_of(2, 4))
SHARD = next(name for name in OLD if name != MANIFEST_NAME)


def without(data: dict[str, Any], name: str) -> dict[str, Any]:
    return {k: v for k, v in data.items() if k != name}


def test_nothing_written_is_the_empty_model() -> None:
    assert read_model({}) == Model()


def test_a_complete_model_reads_back() -> None:
    assert read_model(OLD) == model_of(1, 3)


@pytest.mark.parametrize(
    ("configmaps", "why"),
    [
        ({**OLD, MANIFEST_NAME: NEW[MANIFEST_NAME]}, "does not match"),  # manifest ahead
        (without(NEW, SHARD) if SHARD in NEW else {MANIFEST_NAME: NEW[MANIFEST_NAME]}, "missing"),
        (without(OLD, MANIFEST_NAME), "manifest"),  # shards without a manifest
        ({**OLD, SHARD: {SHARD_KEY: "{not json"}}, "."),
        ({**OLD, MANIFEST_NAME: {"manifest.json": "[]"}}, "."),
    ],
    ids=[
        "manifest-ahead-of-shard",
        "shard-missing",
        "no-manifest",
        "corrupt-shard",
        "bad-manifest",
    ],
)
def test_anything_half_written_or_broken_is_a_value_error_saying_what(
    configmaps: dict[str, Any], why: str
) -> None:
    with pytest.raises(ValueError, match=why):
        read_model(configmaps)


def test_model_data_takes_each_configmaps_text_and_nothing_else() -> None:
    objects = [
        {"metadata": {"name": "a"}, "data": {"k": "v", "n": 1}},
        {"metadata": {"name": "b"}},
        {"metadata": {"name": "c"}, "data": ["not", "a", "mapping"]},
    ]
    assert model_data(objects) == {"a": {"k": "v"}, "b": {}, "c": {}}
