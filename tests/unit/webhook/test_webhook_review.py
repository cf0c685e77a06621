"""The AdmissionReview envelope, map validation through build_response, and the model decoder."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from placement.annotations import PLACEMENT_MAP_LABEL
from placement.model import (
    MANIFEST_NAME,
    CompiledMap,
    CompiledSlot,
    Model,
    encode_model,
)
from placement.model import read_model as load_model
from placement.types import MapKey, NodeName
from tests.unit.webhook_builders import (
    NS,
    make_configmap,
    make_model,
    make_pod,
    placement_yaml,
    review,
)
from webhook.admission import Endpoint, build_response
from webhook.review import MalformedReviewError, Verdict, parse_review, render_response
from webhook.settings import AdmissionSettings

SETTINGS = AdmissionSettings()
MODEL = make_model().map("llm").obj()


def validate(obj: dict[str, Any] | None, **kwargs: Any) -> dict[str, Any]:
    r = review(obj, kind="ConfigMap", resource="configmaps", **kwargs)
    return build_response(r, MODEL, SETTINGS, Endpoint.VALIDATE)


# --- map validation -------------------------------------------------------------------------


def test_valid_map_is_admitted() -> None:
    out = validate(make_configmap("llm", placement_yaml()))
    assert out["response"] == {"uid": out["response"]["uid"], "allowed": True}


def test_invalid_map_is_refused_with_located_messages() -> None:
    cm = make_configmap("llm", placement_yaml(devices="[0, banana]"))
    status = validate(cm)["response"]["status"]
    assert status["code"] == 422
    assert status["reason"] == "Invalid"
    assert status["message"].startswith("configmap inference/llm placement.yaml:10:20: error: ")
    assert "'banana'" in status["message"]


def test_every_problem_is_reported() -> None:
    text = placement_yaml(devices="[0, banana]").replace("devices: [2]", "devices: [-1]")
    message = validate(make_configmap("llm", text))["response"]["status"]["message"]
    assert message.count(": error: ") == 2, message


def test_yaml_syntax_error_is_located() -> None:
    message = validate(make_configmap("llm", "spec: [\n"))["response"]["status"]["message"]
    assert message.startswith("configmap inference/llm placement.yaml:")
    assert "YAML" in message


def test_map_must_name_its_configmap() -> None:
    message = validate(make_configmap("other", placement_yaml("llm")))["response"]["status"][
        "message"
    ]
    assert "configmap inference/other placement.yaml:1:1: error:" in message
    assert "declares inference/llm but is stored in ConfigMap inference/other" in message


def test_missing_key_is_refused() -> None:
    status = validate(make_configmap("llm", None))["response"]["status"]
    assert status["code"] == 422
    assert "data has no key 'placement.yaml'" in status["message"]


def test_key_under_binary_data_is_explained() -> None:
    cm = make_configmap("llm", None)
    cm["binaryData"] = {"placement.yaml": "YWJj"}
    assert "binaryData" in validate(cm)["response"]["status"]["message"]


def test_unlabelled_configmap_is_not_judged() -> None:
    """An UPDATE that removes the label still reaches us (objectSelector matches the old object)."""
    old = make_configmap("llm", "garbage: [")
    new = make_configmap("llm", "garbage: [", labelled=False)
    assert validate(new, operation="UPDATE", old=old)["response"]["allowed"] is True


def test_label_value_other_than_true_is_not_judged() -> None:
    cm = make_configmap("llm", "garbage: [")
    cm["metadata"]["labels"][PLACEMENT_MAP_LABEL] = "false"
    assert validate(cm)["response"]["allowed"] is True


def test_update_is_validated_and_delete_is_not() -> None:
    good = make_configmap("llm", placement_yaml())
    bad = make_configmap("llm", "garbage: [")
    assert validate(bad, operation="UPDATE", old=good)["response"]["allowed"] is False
    assert validate(None, operation="DELETE", old=bad)["response"]["allowed"] is True
    # An update that leaves the map's text as it was (a status annotation) is not judged again.
    assert validate(bad, operation="UPDATE", old=bad)["response"]["allowed"] is True


# --- the envelope ---------------------------------------------------------------------------


def good_review() -> dict[str, Any]:
    return review(make_pod("web-0").obj())


def broken(mutate: Any) -> dict[str, Any]:
    r = good_review()
    mutate(r)
    return r


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ([], "JSON object"),
        ("review", "JSON object"),
        (
            broken(lambda r: r.update(apiVersion="admission.k8s.io/v1beta1")),
            "admissionReviewVersions",
        ),
        (broken(lambda r: r.update(kind="Pod")), "kind must be 'AdmissionReview'"),
        (broken(lambda r: r.pop("request")), "AdmissionReview.request is missing"),
        (broken(lambda r: r.update(request=[])), "AdmissionReview.request must be an object"),
        (broken(lambda r: r["request"].pop("uid")), "request.uid is missing"),
        (broken(lambda r: r["request"].update(uid="")), "request.uid must be 1 to 128"),
        (broken(lambda r: r["request"].update(uid="x" * 500)), "request.uid must be 1 to 128"),
        (broken(lambda r: r["request"].update(uid=7)), "request.uid must be a string"),
        (broken(lambda r: r["request"].pop("kind")), "request.kind is missing"),
        (broken(lambda r: r["request"]["kind"].pop("kind")), "request.kind.kind is missing"),
        (broken(lambda r: r["request"].pop("resource")), "request.resource is missing"),
        (
            broken(lambda r: r["request"].update(operation="PATCH")),
            "request.operation must be one of",
        ),
        (broken(lambda r: r["request"].update(object=None)), "request.object is missing"),
        (broken(lambda r: r["request"].update(object="pod")), "request.object must be an object"),
        (broken(lambda r: r["request"].update(dryRun="yes")), "request.dryRun must be a boolean"),
        (broken(lambda r: r["request"].update(namespace=3)), "request.namespace must be a string"),
    ],
)
def test_malformed_reviews_name_the_problem(body: object, says: str) -> None:
    with pytest.raises(MalformedReviewError) as err:
        build_response(body, MODEL, SETTINGS)
    assert err.value.status == 400
    assert says in err.value.reason


def test_wrong_kind_for_the_endpoint_is_422() -> None:
    with pytest.raises(MalformedReviewError) as err:
        build_response(good_review(), MODEL, SETTINGS, Endpoint.VALIDATE)
    assert err.value.status == 422
    assert "/validate admits ConfigMap objects, not Pod" in err.value.reason
    cm_review = review(make_configmap("llm", placement_yaml()), kind="ConfigMap")
    with pytest.raises(MalformedReviewError, match="/mutate admits Pod objects, not ConfigMap"):
        build_response(cm_review, MODEL, SETTINGS, Endpoint.MUTATE)


def test_pod_from_another_group_is_refused() -> None:
    r = good_review()
    r["request"]["kind"]["group"] = "example.com"
    with pytest.raises(MalformedReviewError, match=r"not example\.com/Pod"):
        build_response(r, MODEL, SETTINGS)


def test_parse_review_reads_every_field() -> None:
    r = review(make_pod("web-0").obj(), uid="u-1", dry_run=True)
    r["request"]["subResource"] = "status"
    request = parse_review(r)
    assert (request.uid, request.kind, request.resource, request.sub_resource) == (
        "u-1",
        "Pod",
        "pods",
        "status",
    )
    assert (request.operation, request.namespace, request.name, request.dry_run) == (
        "CREATE",
        NS,
        "web-0",
        True,
    )


def test_subresource_reviews_are_admitted_unchanged() -> None:
    r = review(make_pod("web-0").label("gpuplace.io/map", "nope").obj())
    r["request"]["subResource"] = "ephemeralcontainers"
    assert build_response(r, MODEL, SETTINGS)["response"]["allowed"] is True


def test_render_denial_and_warnings() -> None:
    verdict = Verdict.deny("no", code=422, reason="Invalid", warnings=["careful"])
    assert render_response("u", verdict) == {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {
            "uid": "u",
            "allowed": False,
            "status": {"status": "Failure", "code": 422, "reason": "Invalid", "message": "no"},
            "warnings": ["careful"],
        },
    }


# --- the model as the cache decodes it ----------------------------------------------------


def model_of(generation: int, maps: int) -> Model:
    return Model(
        generation,
        {
            MapKey(NS, f"m{i}"): CompiledMap(
                MapKey(NS, f"m{i}"), {0: CompiledSlot(0, NodeName("n"), (), (0,))}
            )
            for i in range(maps)
        },
    )


def test_no_manifest_means_no_maps() -> None:
    assert load_model({}) == Model()


def test_encoded_model_round_trips() -> None:
    model = model_of(7, 5)
    assert load_model(encode_model(model)) == model


def test_half_written_model_is_refused() -> None:
    old = encode_model(model_of(1, 3))
    new = encode_model(model_of(2, 4))
    mixed = {**old, MANIFEST_NAME: new[MANIFEST_NAME]}  # new manifest, old shard
    with pytest.raises(ValueError, match="does not match"):
        load_model(mixed)


@pytest.mark.parametrize(
    "manifest",
    ["{}", "[]", '{"generation": 1, "shards": 3}', "not json", '{"generation": "x", "shards": {}}'],
)
def test_broken_manifest_is_a_value_error(manifest: str) -> None:
    data = copy.deepcopy(encode_model(model_of(1, 1)))
    data[MANIFEST_NAME] = {"manifest.json": manifest}
    with pytest.raises(ValueError, match=r".+"):
        load_model(data)
