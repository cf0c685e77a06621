"""Length limits on the provenance annotations of source maps (placement/annotations.py): the
codec never reads an over-long value, the webhook refuses one where it is set, and the controller
keeps serving the map's last valid version with a status that says why."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from controller.changes import SourceChanged
from controller.sources import Form, map_status, read_source
from placement.annotations import (
    MAX_ORIGIN,
    MAX_REVISION,
    MAX_SOURCE_FILE,
    MAX_SOURCE_PATH,
    ORIGIN_ANNOTATION,
    PROVENANCE_LIMITS,
    REVISION_ANNOTATION,
    SOURCE_FILE_ANNOTATION,
    SOURCE_PATH_ANNOTATION,
    STATUS_ANNOTATION,
    provenance_problems,
    source_provenance,
)
from placement.status import Phase
from tests.unit.controller.test_reconcilers import INFERENCE, Keepers, map_text, source
from tests.unit.controller.test_resource_maps import resource
from tests.unit.controller.test_resource_maps import review as resource_review
from tests.unit.webhook_builders import make_configmap, placement_yaml, review
from webhook.mapcheck import check_configmap, check_resource
from webhook.review import Verdict, parse_review

#: One value of each annotation at its limit, and the limit's documented figure.
AT_LIMIT = [
    (REVISION_ANNOTATION, "a" * MAX_REVISION, 128),
    (SOURCE_PATH_ANNOTATION, "p" * MAX_SOURCE_PATH, 256),
    (SOURCE_FILE_ANNOTATION, "f" * MAX_SOURCE_FILE, 512),
    (ORIGIN_ANNOTATION, "path: " + "o" * (MAX_ORIGIN - 7) + "\n", 1024),
]


def stamped(obj: dict[str, Any], **annotations: str) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    out["metadata"].setdefault("annotations", {}).update(annotations)
    return out


@pytest.mark.parametrize(("key", "value", "limit"), AT_LIMIT)
def test_each_limit_admits_its_length_and_refuses_one_more(
    key: str, value: str, limit: int
) -> None:
    assert len(value) == limit == PROVENANCE_LIMITS[key]
    assert provenance_problems({key: value}, "configmap ml/llm") == ()
    assert source_provenance({key: value}) != ("", "")
    over = value + "x" if key != ORIGIN_ANNOTATION else "path: " + "o" * (limit - 6) + "\n"
    assert len(over) == limit + 1
    (problem,) = provenance_problems({key: over}, "configmap ml/llm")
    assert problem.format().startswith(
        f"configmap ml/llm: error: metadata.annotations[{key}]: {limit + 1} characters, "
        f"more than the {limit} this annotation may have"
    )
    # Never read: the over-long value reaches neither the model nor a Binding.
    assert source_provenance({key: over}) == ("", "")


def test_only_the_values_an_update_changes_are_judged() -> None:
    long = "a" * (MAX_REVISION + 1)
    assert provenance_problems({REVISION_ANNOTATION: long}, "x", {REVISION_ANNOTATION: long}) == ()
    assert provenance_problems({REVISION_ANNOTATION: long}, "x", {REVISION_ANNOTATION: "b"})


def check_cm(obj: dict[str, Any], old: dict[str, Any] | None = None) -> Verdict:
    operation = "UPDATE" if old is not None else "CREATE"
    return check_configmap(
        parse_review(
            review(obj, operation=operation, kind="ConfigMap", resource="configmaps", old=old)
        )
    )


def test_the_webhook_refuses_a_configmap_with_an_over_long_provenance_naming_it() -> None:
    cm = make_configmap("llm", placement_yaml())
    long = stamped(cm, **{SOURCE_FILE_ANNOTATION: "m" * (MAX_SOURCE_FILE + 1)})
    verdict = check_cm(long)
    assert not verdict.allowed and verdict.code == 422
    assert f"metadata.annotations[{SOURCE_FILE_ANNOTATION}]: 513 characters" in verdict.message
    assert check_cm(stamped(cm, **{SOURCE_FILE_ANNOTATION: "maps/llm.yaml"})).allowed
    # Set by an update that leaves the text alone: still refused.
    assert not check_cm(long, old=cm).allowed
    # Already there (applied while the webhook was down): the controller's status still writes.
    assert check_cm(stamped(long, **{STATUS_ANNOTATION: '{"phase": "Invalid"}'}), old=long).allowed


def test_the_webhook_refuses_a_resource_with_an_over_long_revision() -> None:
    obj = resource(map_text())
    long = stamped(obj, **{REVISION_ANNOTATION: "r" * (MAX_REVISION + 1)})
    verdict = check_resource(resource_review(long))
    assert not verdict.allowed
    assert f"placementmap inference/llm: error: metadata.annotations[{REVISION_ANNOTATION}]" in (
        verdict.message
    )
    assert not check_resource(resource_review(long, old=obj)).allowed  # metadata only: judged
    assert check_resource(resource_review(obj)).allowed


def test_the_controller_keeps_the_last_valid_version_and_says_why() -> None:
    k = Keepers()
    good = stamped(source(map_text()), **{REVISION_ANNOTATION: "abc123"})
    k.maps.apply_all([SourceChanged(good)])
    k.maps.publish(dict, first=True)
    generation = k.maps.model.generation
    assert k.maps.model.maps[INFERENCE].provenance.revision == "abc123"
    long = stamped(
        source(map_text(devices="[1]")), **{REVISION_ANNOTATION: "r" * (MAX_REVISION + 1)}
    )
    k.maps.apply_all([SourceChanged(long)])
    k.maps.publish(dict, first=False)
    assert k.maps.model.generation == generation
    assert k.maps.model.maps[INFERENCE].provenance.revision == "abc123"
    state = k.maps.sources[INFERENCE]
    assert state.valid is not None and state.provenance.revision == "abc123"
    status = map_status(state, None, generation, 0)
    assert status.phase is Phase.INVALID
    assert f"metadata.annotations[{REVISION_ANNOTATION}]: 129 characters" in status.message
    assert "still serving version" in status.message


def test_a_configmap_is_read_again_when_only_its_provenance_changes() -> None:
    text = map_text()
    good = read_source(stamped(source(text), **{REVISION_ANNOTATION: "abc"}), None)
    assert not good.errors
    long = stamped(source(text), **{REVISION_ANNOTATION: "r" * (MAX_REVISION + 1)})
    refused = read_source(long, good)
    assert refused.errors and refused.valid is good.valid and refused.provenance.revision == "abc"
    assert read_source(long, refused) is refused  # the same refusal: nothing read again
    fixed = read_source(stamped(source(text), **{REVISION_ANNOTATION: "def"}), refused)
    assert not fixed.errors and fixed.provenance.revision == "def"
    assert fixed.form is Form.CONFIGMAP
