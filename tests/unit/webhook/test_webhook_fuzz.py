"""Thousands of malformed and random AdmissionReviews: the app answers 200 or a 4xx, never 500.

Every 200 is checked too: it answers the request's uid, and its patch applies to the object (with
an independent RFC 6902 implementation) and leaves the pod wired.
"""

from __future__ import annotations

import copy
import functools
import json
import random
from collections.abc import Callable
from typing import Any

import jsonpatch
import pytest
from flask.testing import FlaskClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from placement.annotations import (
    CUDA_ANNOTATION,
    INDEX_LABEL,
    LEGACY_ANNOTATION,
    MANAGED_ENV,
    MAP_LABEL,
    PREFIX,
    STATEFULSET_INDEX_LABEL,
)
from placement.types import EnvMode
from tests.unit.webhook_builders import (
    make_configmap,
    make_model,
    make_pod,
    patch_of,
    placement_yaml,
    review,
)
from webhook.app import create_app
from webhook.modelcache import StaticModel
from webhook.settings import ServerSettings, WebhookSettings

MODEL = make_model().map("llm").map("uuid-map", range(3), env_mode=EnvMode.UUID).obj()
ANSWERS = {200, 400, 413, 415, 422}
KEYS = [
    "apiVersion",
    "kind",
    "request",
    "uid",
    "object",
    "metadata",
    "spec",
    "labels",
    "annotations",
    "containers",
    "initContainers",
    "env",
    "name",
    "value",
    "operation",
    MAP_LABEL,
    CUDA_ANNOTATION,
    "gpuplace.io/x~y/z",
]


def seeds() -> list[dict[str, Any]]:
    """Valid reviews of every shape the app handles, to mutate."""
    pods = [
        make_pod("web-1").label(MAP_LABEL, "llm").obj(),
        make_pod("web-2")
        .label(MAP_LABEL, "uuid-map")
        .annotation(CUDA_ANNOTATION, "0")
        .container(
            "a", [{"name": "CUDA_VISIBLE_DEVICES", "value": "1"}, {"name": "X", "value": "y"}]
        )
        .container("b")
        .container("i", [], init=True)
        .obj(),
        make_pod("web-9").label(MAP_LABEL, "llm").label(STATEFULSET_INDEX_LABEL, "9").obj(),
        make_pod("w").label(MAP_LABEL, "llm").label(INDEX_LABEL, "2").obj(),
        make_pod("t-1")
        .annotation(LEGACY_ANNOTATION, "0=n1:0\n1=n2:1,2")
        .scheduler("gpu-scheduler")
        .obj(),
        make_pod("plain").obj(),
    ]
    out = [review(p) for p in pods]
    out.append(
        review(make_configmap("llm", placement_yaml()), kind="ConfigMap", resource="configmaps")
    )
    out.append(review(make_configmap("llm", "spec: ["), kind="ConfigMap", resource="configmaps"))
    return out


SEEDS = seeds()

json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


@pytest.fixture(scope="module")
def client() -> FlaskClient:
    # A small body limit so that random big bodies exercise the 413 path too.
    app = create_app(
        WebhookSettings(server=ServerSettings(max_body_bytes=256 * 1024)), StaticModel(MODEL)
    )
    return app.test_client()


def check_answer(client: FlaskClient, path: str, data: bytes, sent: Any) -> None:
    response = client.post(path, data=data, content_type="application/json")
    assert response.status_code in ANSWERS, (response.status_code, response.data[:500])
    body = response.get_json()
    if response.status_code != 200:
        assert isinstance(body["reason"], str)
        assert body["reason"]
        return
    assert body["apiVersion"] == "admission.k8s.io/v1"
    assert body["kind"] == "AdmissionReview"
    answer = body["response"]
    assert answer["uid"] == sent["request"]["uid"]
    if not answer["allowed"]:
        assert answer["status"]["message"]
        return
    ops = patch_of(body)
    if not ops:
        return
    pod = jsonpatch.apply_patch(copy.deepcopy(sent["request"]["object"]), ops)
    assert not any(k.startswith(PREFIX) for k in pod["metadata"].get("annotations") or {})
    for list_name in ("initContainers", "containers"):
        for container in pod["spec"].get(list_name) or []:
            names = [e.get("name") for e in container["env"]]
            assert names[0] == "CUDA_VISIBLE_DEVICES"
            wired = 3 if "NVIDIA_VISIBLE_DEVICES" in names[:3] else 2
            assert not {n for n in names[wired:] if isinstance(n, str)} & set(MANAGED_ENV)


def send(client: FlaskClient, path: str, sent: Any) -> None:
    try:
        data = json.dumps(sent).encode()
    except (ValueError, TypeError):
        return
    check_answer(client, path, data, sent)


def paths(tree: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every node's path; picking among them uniformly mostly hits the object, where most of
    the nodes are, so the pod and map code see the mutations rather than only the envelope."""
    out = [prefix]
    if isinstance(tree, dict):
        for key, child in tree.items():
            out.extend(paths(child, (*prefix, key)))
    elif isinstance(tree, list):
        for i, child in enumerate(tree):
            out.extend(paths(child, (*prefix, i)))
    return out


def mutate_tree(tree: Any, rng: random.Random, replacement: Callable[[], Any]) -> Any:
    """Replaces, deletes or inserts next to one node chosen uniformly."""
    path = rng.choice(paths(tree))
    if not path:
        return replacement()
    tree = copy.deepcopy(tree)
    parent = tree
    for step in path[:-1]:
        parent = parent[step]
    key = path[-1]
    action = rng.random()
    if action < 0.3:
        del parent[key]
    elif action < 0.5 and isinstance(parent, list):
        parent.insert(key, replacement())
    else:
        parent[key] = replacement()
    return tree


@pytest.mark.slow
def test_random_mutations_of_valid_reviews(client: FlaskClient) -> None:
    rng = random.Random(20261122)
    pool: list[Any] = [
        None, True, 0, -1, 2**70, 1.5, "", "x", "CREATE", "Pod", [], {}, [{}], {"name": 3},
        {"name": "CUDA_VISIBLE_DEVICES"}, "admission.k8s.io/v1", "gpu-scheduler", "llm", "3",
        "a" * 3000,
    ]  # fmt: skip
    for _ in range(6000):
        seed = rng.choice(SEEDS)
        sent = seed
        for _ in range(rng.randint(1, 4)):
            sent = mutate_tree(sent, rng, lambda: copy.deepcopy(rng.choice(pool)))
        path = "/validate" if seed["request"]["kind"]["kind"] == "ConfigMap" else "/mutate"
        if rng.random() < 0.1:
            path = "/validate" if path == "/mutate" else "/mutate"
        send(client, path, sent)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.sampled_from(SEEDS), steps=st.lists(st.tuples(st.randoms(), json_values), max_size=3)
)
def test_hypothesis_replaces_subtrees(
    client: FlaskClient, seed: dict[str, Any], steps: list[tuple[random.Random, Any]]
) -> None:
    sent: Any = seed
    for rng, value in steps:
        sent = mutate_tree(sent, rng, functools.partial(copy.deepcopy, value))
    path = "/validate" if seed["request"]["kind"]["kind"] == "ConfigMap" else "/mutate"
    send(client, path, sent)


@pytest.mark.slow
@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=json_values, path=st.sampled_from(["/mutate", "/validate"]))
def test_hypothesis_arbitrary_json(client: FlaskClient, body: Any, path: str) -> None:
    send(client, path, body)


@settings(max_examples=500, deadline=None)
@given(data=st.binary(max_size=2000), path=st.sampled_from(["/mutate", "/validate"]))
def test_hypothesis_arbitrary_bytes(client: FlaskClient, data: bytes, path: str) -> None:
    response = client.post(path, data=data, content_type="application/json")
    assert response.status_code in ANSWERS - {200} or data.strip().startswith(b"{")
    assert response.status_code in ANSWERS
