"""Maps and the policy as custom resources: read, merged with the ConfigMap form, given a status in
Kubernetes conventions, admitted by the webhook with field paths."""

from __future__ import annotations

import copy
from typing import Any

import yaml

from controller.changes import PolicyChanged, SourceChanged, SourceDeleted
from controller.metrics import ControllerMetrics
from controller.sources import Form
from controller.statuswriter import StatusWriter
from kubeio.events import EventRecorder
from placement.resourcestatus import (
    comparable,
    conditions,
    resource_status,
    status_from_resource,
)
from placement.status import COMPILING, MapStatus, Phase, SlotCounts
from placement.types import MapKey
from tests.unit.controller.test_reconcilers import (
    INFERENCE,
    ZERO,
    Apiserver,
    FakeInformer,
    Keepers,
    map_text,
    source,
)
from tests.unit.placement.test_grants import POLICY
from webhook.mapcheck import check_policy_resource, check_resource
from webhook.review import AdmissionRequest


def resource(text: str, generation: int = 1) -> dict[str, Any]:
    """The PlacementMap custom resource of a map file, as the apiserver returns it."""
    doc = yaml.safe_load(text)
    doc["metadata"] |= {"generation": generation, "uid": "u-1", "resourceVersion": "7"}
    return doc


def test_a_custom_resource_is_served_like_its_configmap() -> None:
    k = Keepers()
    k.maps.apply_all([SourceChanged(resource(map_text()), Form.RESOURCE)])
    k.maps.publish(dict, first=True)
    state = k.maps.sources[INFERENCE]
    assert state.form is Form.RESOURCE and state.generation == 1 and state.valid is not None
    assert INFERENCE in k.maps.model.maps


def test_a_status_write_on_the_resource_changes_nothing() -> None:
    k = Keepers()
    obj = resource(map_text())
    k.maps.apply_all([SourceChanged(obj, Form.RESOURCE)])
    echoed = copy.deepcopy(obj) | {"status": {"phase": "Valid"}}
    assert k.maps.apply(SourceChanged(echoed, Form.RESOURCE)) is None


def test_both_forms_with_the_same_content_are_one_map_and_the_resource_wins() -> None:
    k = Keepers()
    k.maps.apply_all([SourceChanged(source(map_text()))])
    k.maps.publish(dict, first=True)
    k.maps.apply_all([SourceChanged(resource(map_text()), Form.RESOURCE)])
    k.maps.publish(dict, first=False)
    state = k.maps.sources[INFERENCE]
    assert state.form is Form.RESOURCE and not state.errors and not state.form_conflict
    # The ConfigMap goes (a migration's end): the resource keeps serving the same slots.
    slots = k.maps.model.maps[INFERENCE].slots
    k.maps.apply_all([SourceDeleted(source(map_text()))])
    k.maps.publish(dict, first=False)
    assert k.maps.model.maps[INFERENCE].slots == slots
    k.maps.flush()
    assert INFERENCE in k.published.current.sources  # the resource still declares it


def test_both_forms_with_different_content_are_a_conflict_that_keeps_what_was_served() -> None:
    k = Keepers()
    k.maps.apply_all([SourceChanged(source(map_text()))])
    k.maps.publish(dict, first=True)
    served = k.maps.model.maps[INFERENCE]
    k.maps.apply_all([SourceChanged(resource(map_text(devices="[1]")), Form.RESOURCE)])
    k.maps.publish(dict, first=False)
    state = k.maps.sources[INFERENCE]
    assert state.form_conflict and state.valid is not None
    assert "ConfigMap inference/llm declares this map with other content" in state.errors[0].message
    assert k.maps.model.maps[INFERENCE].slots == served.slots  # never a silent pick
    # Deleting either one ends the conflict: the other is served.
    k.maps.apply_all([SourceDeleted(source(map_text()))])
    k.maps.publish(dict, first=False)
    assert not k.maps.sources[INFERENCE].form_conflict
    assert k.maps.model.maps[INFERENCE].slots != served.slots


def test_an_invalid_resource_names_the_field_path_without_lines() -> None:
    k = Keepers()
    k.maps.apply_all([SourceChanged(resource(map_text(devices="[0, 0]")), Form.RESOURCE)])
    (error,) = k.maps.sources[INFERENCE].errors
    assert error.location.line == 0
    assert error.format().startswith("placementmap inference/llm: error: spec.placements[0]")


def written_statuses(
    forms: dict[Form, dict[str, Any]],
) -> tuple[Apiserver, dict[str, Any]]:
    """The status patches a StatusWriter makes for one map declared in `forms`."""
    k = Keepers()
    for form, obj in forms.items():
        k.maps.apply_all([SourceChanged(obj, form)])
    k.maps.publish(dict, first=True)
    k.maps.flush()
    api = Apiserver()
    writer = StatusWriter(
        api,  # type: ignore[arg-type]
        EventRecorder(api, "test"),  # type: ignore[arg-type]
        ControllerMetrics(),
        k.published,
        ZERO,
        sources=FakeInformer([forms[Form.CONFIGMAP]] if Form.CONFIGMAP in forms else []),  # type: ignore[arg-type]
        resources=FakeInformer([forms[Form.RESOURCE]] if Form.RESOURCE in forms else []),  # type: ignore[arg-type]
        bound_seconds=5.0,
    )
    assert writer.reconcile([INFERENCE]) == {}
    return api, {path: body for verb, path, body in api.writes if verb == "patch"}


def test_the_resource_gets_conditions_and_the_superseded_configmap_says_so() -> None:
    api, patches = written_statuses(
        {Form.CONFIGMAP: source(map_text()), Form.RESOURCE: resource(map_text(), generation=4)}
    )
    status = patches["/apis/gpuplace.io/v1alpha1/namespaces/inference/placementmaps/llm/status"][
        "status"
    ]
    assert status["observedGeneration"] == 4 and status["supersedes"] == "configmap inference/llm"
    assert {c["type"]: c["status"] for c in status["conditions"]} == {
        "Valid": "True",
        "Ready": "False",  # no node gpu-1 in this cluster: the slot is blocked
        "Degraded": "True",
        "Drifted": "False",
        "Progressing": "False",
    }
    annotation = patches["/api/v1/namespaces/inference/configmaps/llm"]["metadata"]["annotations"]
    cm_status = MapStatus.from_json(annotation["gpuplace.io/status"])
    assert cm_status.message.startswith("superseded by PlacementMap inference/llm")
    # Each object's Event names its own kind.
    kinds = {e["involvedObject"]["kind"] for e in api.events}
    assert kinds == {"PlacementMap", "ConfigMap"}


def test_a_form_conflict_is_the_phase_conflict_on_both_objects() -> None:
    _, patches = written_statuses(
        {Form.CONFIGMAP: source(map_text()), Form.RESOURCE: resource(map_text(devices="[1]"))}
    )
    status = patches["/apis/gpuplace.io/v1alpha1/namespaces/inference/placementmaps/llm/status"][
        "status"
    ]
    assert status["phase"] == "Conflict" and status["supersedes"] == ""
    valid = next(c for c in status["conditions"] if c["type"] == "Valid")
    assert valid["status"] == "False" and "other content" in valid["message"]
    annotation = patches["/api/v1/namespaces/inference/configmaps/llm"]["metadata"]["annotations"]
    assert MapStatus.from_json(annotation["gpuplace.io/status"]).phase is Phase.CONFLICT


# -- the status codec -----------------------------------------------------------------------------


def verdict(phase: Phase, message: str = "2 slots", **slots: int) -> MapStatus:
    counts = SlotCounts(**({"total": 2, "served": 2} | slots))
    return MapStatus(phase, 3, "v1", message, slots=counts, rollout=(slots and "") or "")


def test_conditions_follow_the_phase() -> None:
    def of(status: MapStatus) -> dict[str, tuple[bool, str]]:
        return {c.type.value: (c.status, c.reason) for c in conditions(status)}

    assert of(verdict(Phase.VALID)) == {
        "Valid": (True, "Valid"),
        "Ready": (True, "Serving"),
        "Degraded": (False, "AsDeclared"),
        "Drifted": (False, "NoDrift"),
        "Progressing": (False, "Stable"),
    }
    assert of(verdict(Phase.VALID, COMPILING))["Progressing"] == (True, "Compiling")
    assert of(verdict(Phase.INVALID, "1 error(s)"))["Valid"] == (False, "Invalid")
    assert of(verdict(Phase.DEGRADED, "GPU 1 missing"))["Degraded"] == (True, "Degraded")
    drifting = MapStatus(
        Phase.VALID,
        3,
        "v",
        "2 slots",
        slots=SlotCounts(2, 2, 2, 0, 1),
        rollout="evict, maxUnavailable 1",
    )
    assert of(drifting)["Drifted"] == (True, "PodsDrifted")
    assert of(drifting)["Progressing"] == (True, "RollingOut")


def test_a_condition_keeps_its_transition_time_until_its_status_changes() -> None:
    first = resource_status(verdict(Phase.VALID), 1, None, "2026-01-01T00:00:00Z")
    same = resource_status(verdict(Phase.VALID), 1, first, "2026-01-02T00:00:00Z")
    assert same == first and comparable(same) == comparable(first)
    worse = resource_status(verdict(Phase.DEGRADED, "x"), 2, first, "2026-01-03T00:00:00Z")
    times = {c["type"]: c["lastTransitionTime"] for c in worse["conditions"]}
    assert times["Valid"] == "2026-01-01T00:00:00Z"
    assert times["Degraded"] == times["Ready"] == "2026-01-03T00:00:00Z"


def test_the_resource_status_reads_back_as_the_same_verdict() -> None:
    status = MapStatus(
        Phase.DEGRADED,
        9,
        "abc",
        "GPU 1 missing",
        slots=SlotCounts(4, 3, 2, 1, 1, 0, 0),
        serving_version="abc",
        revision="deadbeef",
        rollout="manual",
    )
    assert status_from_resource(resource_status(status, 2, None, "t")) == status


# -- admission ------------------------------------------------------------------------------------


def review(obj: dict[str, Any], old: dict[str, Any] | None = None) -> AdmissionRequest:
    meta = obj["metadata"]
    return AdmissionRequest(
        "uid",
        obj["kind"],
        "gpuplace.io",
        "placementmaps",
        "",
        "UPDATE" if old else "CREATE",
        meta.get("namespace", ""),
        meta["name"],
        obj,
        old,
        False,
    )


def test_the_webhook_refuses_a_semantic_error_naming_the_field_path() -> None:
    verdict_ = check_resource(review(resource(map_text(devices='["GPU-nope"]'))))
    assert not verdict_.allowed and verdict_.code == 422
    assert "placementmap inference/llm: error: spec.placements[0].devices[0]" in verdict_.message


def test_the_webhook_admits_a_metadata_only_update_without_parsing() -> None:
    bad = resource(map_text(devices="[0, 0]"))
    relabelled = copy.deepcopy(bad)
    relabelled["metadata"]["labels"] = {"team": "a"}
    assert check_resource(review(relabelled, old=bad)).allowed
    assert not check_resource(review(bad)).allowed


def test_the_webhook_checks_the_policy_resource() -> None:
    doc = yaml.safe_load(POLICY)
    doc["metadata"] = {"name": "gpuplace-policy"}
    assert check_policy_resource(review(doc)).allowed
    doc["spec"]["grants"][0]["nodes"] = ["Not A Node!"]
    denied = check_policy_resource(review(doc))
    assert not denied.allowed and "spec.grants[0].nodes[0]" in denied.message


# -- the policy -----------------------------------------------------------------------------------


def policy_resource(text: str = POLICY) -> dict[str, Any]:
    doc = yaml.safe_load(text)
    doc["metadata"] = {"name": "gpuplace-policy", "generation": 2}
    return doc


def test_the_policy_resource_wins_over_its_configmap_which_says_so() -> None:
    k = Keepers()
    configmap = source(POLICY, "gpuplace-system", "gpuplace-policy") | {
        "data": {"policy.yaml": POLICY}
    }
    k.maps.apply_all([PolicyChanged(configmap)])
    from_configmap = k.grants.policy
    assert from_configmap.grants
    k.maps.apply_all([PolicyChanged(policy_resource(), Form.RESOURCE)])
    assert k.grants.policy.source == "placementpolicy gpuplace-policy"
    assert k.grants.policy.grants == from_configmap.grants
    assert k.grants.verdicts[Form.CONFIGMAP].phase == "Superseded"
    assert k.grants.verdicts[Form.RESOURCE].phase == "Valid"
    # The resource goes: the ConfigMap is read again.
    k.maps.apply_all([PolicyChanged(None, Form.RESOURCE)])
    assert k.grants.verdicts[Form.CONFIGMAP].phase == "Valid"
    assert k.grants.policy.source.startswith("configmap")


def test_an_invalid_policy_resource_keeps_the_last_valid_policy() -> None:
    k = Keepers()
    k.maps.apply_all([PolicyChanged(policy_resource(), Form.RESOURCE)])
    before = k.grants.policy
    broken = policy_resource()
    broken["spec"]["grants"][0]["nodes"] = ["Not A Node!"]
    assert not k.grants.apply_policy(broken, Form.RESOURCE)
    assert k.grants.policy == before
    assert k.grants.verdicts[Form.RESOURCE].phase == "Invalid"
    assert "spec.grants[0].nodes[0]" in k.grants.verdicts[Form.RESOURCE].message


def test_map_keys_of_resources_and_configmaps_are_the_same() -> None:
    assert MapKey("inference", "llm") == INFERENCE


def test_a_legacy_text_longer_than_a_configmap_holds_is_refused_unparsed() -> None:
    text = "".join(f"{i}=node1:0\n" for i in range(120_000))  # 1.3 MB of lines
    obj = resource(map_text())
    obj["spec"] = {"map": text}
    refused = check_resource(review(obj))
    assert not refused.allowed
    assert "spec.map: map is longer than 1048576 characters" in refused.message
