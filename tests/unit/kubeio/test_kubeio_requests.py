"""Requests and bodies are built without I/O: everything that goes on the wire, checked here."""

from __future__ import annotations

import json

import pytest

from kubeio import bodies
from kubeio.client import Response
from kubeio.paths import PODS
from kubeio.requests import JSON, JSON_PATCH, MERGE_PATCH, Request, decode, prepare


@pytest.mark.parametrize(
    ("query", "target"),
    [
        (None, "/api/v1/pods"),
        ({}, "/api/v1/pods"),
        ({"limit": 500}, "/api/v1/pods?limit=500"),
        ({"continue": None, "labelSelector": ""}, "/api/v1/pods"),
        (
            {"watch": True, "allowWatchBookmarks": False},
            "/api/v1/pods?watch=true&allowWatchBookmarks=false",
        ),
        (
            {"labelSelector": "gpuplace.io/map in (a,b)"},
            "/api/v1/pods?labelSelector=gpuplace.io%2Fmap+in+%28a%2Cb%29",
        ),
        (
            {"fieldSelector": "spec.nodeName=", "limit": 0},
            "/api/v1/pods?fieldSelector=spec.nodeName%3D&limit=0",
        ),
    ],
)
def test_the_query_leaves_out_unset_options_and_encodes_the_rest(
    query: dict[str, object] | None, target: str
) -> None:
    assert prepare("GET", "/api/v1/pods", query=query).target == target


def test_a_get_has_no_body_and_no_content_type() -> None:
    assert prepare("GET", "/api/v1/pods") == Request("GET", "/api/v1/pods")


@pytest.mark.parametrize(
    ("method", "content_type", "sent"),
    [
        ("POST", None, JSON),
        ("PUT", None, JSON),
        ("PATCH", None, MERGE_PATCH),
        ("PATCH", JSON_PATCH, JSON_PATCH),
        ("DELETE", None, JSON),
    ],
)
def test_a_body_is_json_with_the_content_type_its_method_implies(
    method: str, content_type: str | None, sent: str
) -> None:
    request = prepare(method, "/api/v1/pods/x", body={"a": [1, "é"]}, content_type=content_type)
    assert request.content_type == sent
    assert request.body is not None
    assert json.loads(request.body) == {"a": [1, "é"]}


def test_bytes_are_sent_as_they_are() -> None:
    request = prepare("PATCH", "/x", body=b"raw", content_type="application/apply-patch+yaml")
    assert (request.body, request.content_type) == (b"raw", "application/apply-patch+yaml")


@pytest.mark.parametrize(
    ("method", "path", "error"),
    [
        ("FETCH", "/api", "'FETCH': not an HTTP method"),
        ("get", "/api", "'get': not an HTTP method"),
        ("GET", "api/v1", "'api/v1': an API path starts with /"),
    ],
)
def test_a_request_that_cannot_exist_is_refused_before_it_is_sent(
    method: str, path: str, error: str
) -> None:
    with pytest.raises(ValueError, match=error):
        prepare(method, path)


def test_describe_leaves_out_the_query() -> None:
    request = prepare("GET", "/api/v1/pods", query={"continue": "secret-token"})
    assert request.describe() == "GET /api/v1/pods"


def test_decode_reads_json_says_none_for_empty_and_refuses_the_rest() -> None:
    assert decode("GET", "/x", b'{"kind":"Status"}') == {"kind": "Status"}
    assert decode("GET", "/x", b"") is None
    with pytest.raises(ValueError, match="GET /x: the response is not JSON"):
        decode("GET", "/x", b"<html>")


def test_a_response_decodes_json_and_keeps_an_error_page_as_text() -> None:
    assert Response(201, b'{"a":1}').json() == {"a": 1}
    assert Response(204, b"").json() is None
    assert Response(502, b"Bad Gateway").json() == "Bad Gateway"


def test_a_binding_names_pod_node_uid_and_carries_the_annotations() -> None:
    body = bodies.binding("web-0", "ml", "u-1", "gpu-a-01", {"gpuplace.io/node": "gpu-a-01"})
    assert body == {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {
            "name": "web-0",
            "namespace": "ml",
            "uid": "u-1",
            "annotations": {"gpuplace.io/node": "gpu-a-01"},
        },
        "target": {"apiVersion": "v1", "kind": "Node", "name": "gpu-a-01"},
    }
    path = PODS.item("web-0", "ml", "binding")
    assert prepare("POST", path, body=body).target == "/api/v1/namespaces/ml/pods/web-0/binding"


def test_a_binding_without_uid_or_annotations_leaves_them_out() -> None:
    body = bodies.binding("web-0", "ml", "", "n", {})
    assert body["metadata"] == {"name": "web-0", "namespace": "ml"}


def test_an_eviction_is_for_this_pod_only() -> None:
    body = bodies.eviction("web-0", "ml", "u-1")
    assert body["kind"] == "Eviction"
    assert body["deleteOptions"] == {"preconditions": {"uid": "u-1"}}


def test_a_lease_carries_its_spec() -> None:
    spec = bodies.lease_spec("agent-a", 40, "t0", "t1", 2)
    assert spec == {
        "holderIdentity": "agent-a",
        "leaseDurationSeconds": 40,
        "acquireTime": "t0",
        "renewTime": "t1",
        "leaseTransitions": 2,
    }
    lease = bodies.lease("gpu-a-01", "gpuplace-inventory", spec)
    assert lease["apiVersion"] == "coordination.k8s.io/v1"
    assert lease["metadata"] == {"name": "gpu-a-01", "namespace": "gpuplace-inventory"}
    assert lease["spec"] is spec


def test_delete_options_and_namespace() -> None:
    assert bodies.delete_options() == {"apiVersion": "v1", "kind": "DeleteOptions"}
    assert bodies.delete_options(0)["gracePeriodSeconds"] == 0
    assert bodies.namespace("ml", {"team": "a"})["metadata"] == {
        "name": "ml",
        "labels": {"team": "a"},
    }


def test_extra_headers_are_kept_in_order() -> None:
    request = prepare("GET", "/api/v1/pods", headers={"traceparent": "00-a-b-01", "X-Two": "2"})
    assert request.headers == (("traceparent", "00-a-b-01"), ("X-Two", "2"))
    assert prepare("GET", "/api/v1/pods").headers == ()
