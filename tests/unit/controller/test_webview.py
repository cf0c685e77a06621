"""The read-only web view (controller/webview.py): the page from the caches, read-only HTTP, and
the bearer-token check (TokenReview, then SubjectAccessReview) against a recorded API."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from controller import webview
from controller.settings import ControllerSettings
from controller.webview import Authorizer, ViewSources, WebServer, loopback_only, page
from gpuplace.commands.controller import web_view_problem
from kubeio.errors import APIServerError
from kubeio.httpserver import ServerMetrics
from kubeio.pod import Pod
from placement.annotations import (
    MAP_LABEL,
    STATUS_ANNOTATION,
    BindingDecision,
    encode_binding,
)
from placement.inventory import GpuDevice, NodeInventory
from placement.types import GpuUuid, MapKey, NodeName

A = NodeName("node-a")
INVENTORY = NodeInventory(
    A,
    (
        GpuDevice(0, GpuUuid("GPU-a0"), "H100"),
        GpuDevice(1, GpuUuid("GPU-a1"), "H100", healthy=False, health_reason="XID 79"),
    ),
)


def bound(name: str, index: int, uuid: str) -> Pod:
    decision = BindingDecision(MapKey("ml", "llm"), index, A, (GpuUuid(uuid),), "0", 1)
    return Pod.of(
        {
            "metadata": {
                "namespace": "ml",
                "name": name,
                "uid": f"u-{name}",
                "labels": {MAP_LABEL: "llm"},
                "annotations": encode_binding(decision),
            },
            "spec": {"nodeName": A},
            "status": {"phase": "Running"},
        }
    )


WAITING = Pod.of(
    {
        "metadata": {"namespace": "ml", "name": "web-5", "uid": "u5", "labels": {MAP_LABEL: "llm"}},
        "spec": {},
        "status": {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "DeviceUnhealthy",
                    "message": "GPU 1 <XID 79> & more",
                }
            ],
        },
    }
)

MAP = {
    "metadata": {
        "namespace": "ml",
        "name": "llm",
        "annotations": {
            "gpuplace.io/revision": "4f2a91c",
            "gpuplace.io/source-file": "clusters/dev/llm.yaml",
            STATUS_ANNOTATION: json.dumps(
                {
                    "phase": "Degraded",
                    "message": "index 5: <GPU unhealthy>",
                    "slots": {"total": 6, "bound": 1, "blocked": 1, "drifted": 0},
                }
            ),
        },
    },
    "data": {"placement.yaml": "secret-looking text"},
}

SOURCES = ViewSources(
    "replica-1",
    lambda: True,
    lambda: {A: INVENTORY},
    lambda: [bound("web-0", 0, "GPU-a0"), WAITING],
    lambda: [MAP],
)


def test_the_page_has_the_grid_the_maps_and_the_waiting_pods_escaped() -> None:
    text = page(SOURCES, now=0)
    assert 'data-node="node-a" data-gpu="0" data-uuid="GPU-a0" data-state="held"' in text
    assert '<span class="slot">llm#0</span><br><span class="pod">ml/web-0</span></td>' in text
    assert 'data-state="degraded" title="XID 79"><span class="slot">DEGRADED</span></td>' in text
    assert "replica replica-1 (leader)" in text
    assert "<td>ml/llm</td><td>Degraded</td><td>6 total, 1 bound, 1 blocked, 0 drifted</td>" in text
    assert "<td>4f2a91c</td><td>clusters/dev/llm.yaml</td>" in text
    assert "index 5: &lt;GPU unhealthy&gt;" in text and "<GPU unhealthy>" not in text
    assert "<td>ml/web-5</td><td>llm</td><td>DeviceUnhealthy</td>" in text
    assert "GPU 1 &lt;XID 79&gt; &amp; more" in text
    assert "secret-looking text" not in text  # the map's body is not shown
    assert "<script" not in text


@pytest.fixture
def server() -> Iterator[WebServer]:
    web = WebServer("127.0.0.1", 0, SOURCES).start()
    try:
        yield web
    finally:
        web.stop()


def request(port: int, method: str = "GET", path: str = "/", token: str = "") -> tuple[int, str]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_get_only(server: WebServer) -> None:
    status, body = request(server.port)
    assert status == 200 and "Who holds which GPU" in body
    assert request(server.port, path="/healthz") == (200, "ok\n")
    assert request(server.port, path="/api")[0] == 404
    for method in ("POST", "PUT", "PATCH", "DELETE"):
        assert request(server.port, method=method)[0] == 405


class ReviewApi:
    """Answers TokenReviews and SubjectAccessReviews as an apiserver would, recording them."""

    def __init__(self, users: dict[str, str], allowed: set[str]) -> None:
        self.users = users
        self.allowed = allowed
        self.bodies: list[dict[str, Any]] = []
        self.down = False

    def create(self, path: str, body: dict[str, Any], **_: Any) -> dict[str, Any]:
        if self.down:
            raise APIServerError(503, "ServiceUnavailable", "down")
        self.bodies.append(body)
        if body["kind"] == "TokenReview":
            user = self.users.get(body["spec"]["token"])
            if user is None:
                return {"status": {"authenticated": False}}
            return {"status": {"authenticated": True, "user": {"username": user, "groups": []}}}
        assert path == "/apis/authorization.k8s.io/v1/subjectaccessreviews"
        return {"status": {"allowed": body["spec"]["user"] in self.allowed}}


def test_tokens_are_reviewed_and_access_checked_as_kube_rbac_proxy_does() -> None:
    api = ReviewApi({"t-alice": "alice", "t-bob": "bob"}, allowed={"alice"})
    authorizer = Authorizer(api, "gpuplace-system", "gpuplace-controller")  # type: ignore[arg-type]
    web = WebServer("127.0.0.1", 0, SOURCES, authorizer).start()
    try:
        assert request(web.port)[0] == 401  # no token
        assert request(web.port, token="forged")[0] == 401
        status, body = request(web.port, token="t-bob")
        assert status == 403 and "services/proxy gpuplace-system/gpuplace-controller" in body
        status, body = request(web.port, token="t-alice")
        assert status == 200 and "Who holds which GPU" in body
        access = next(b for b in api.bodies if b["kind"] == "SubjectAccessReview")
        assert access["spec"]["resourceAttributes"] == {
            "namespace": "gpuplace-system",
            "verb": "get",
            "resource": "services",
            "subresource": "proxy",
            "name": "gpuplace-controller",
        }
        reviews = len(api.bodies)
        assert request(web.port, token="t-alice")[0] == 200  # the verdict is reused a while
        assert len(api.bodies) == reviews
        api.down = True
        assert request(web.port, token="t-carol")[0] == 503  # unknown, and no apiserver to ask
        assert request(web.port, path="/healthz")[0] == 200  # probes need no token
    finally:
        web.stop()


def test_beyond_localhost_the_view_needs_authenticate() -> None:
    with pytest.raises(ValueError, match=r"--web-authenticate .*controller\.web\.authenticate"):
        WebServer("0.0.0.0", 0, SOURCES)
    assert loopback_only("127.0.0.1") and loopback_only("::1") and loopback_only("localhost")
    assert not loopback_only("") and not loopback_only("0.0.0.0") and not loopback_only("10.0.0.1")

    def problem(address: str, authenticate: bool = False) -> str:
        return web_view_problem(
            ControllerSettings(web_address=address, web_authenticate=authenticate)
        )

    refused = problem("0.0.0.0:8090")
    assert "--web-authenticate" in refused and "controller.web.authenticate: true" in refused
    assert problem(":8090") == refused.replace("0.0.0.0:8090", ":8090")
    assert problem("0.0.0.0:8090", authenticate=True) == ""
    assert problem("127.0.0.1:8090") == problem("[::1]:8090") == problem("") == ""
    assert "HOST:PORT" in problem("127.0.0.1")


def test_random_tokens_cannot_grow_the_verdicts_or_push_out_known_ones() -> None:
    api = ReviewApi({"t-alice": "alice"}, allowed={"alice"})
    authorizer = Authorizer(api, "gpuplace-system", "gpuplace-controller")  # type: ignore[arg-type]
    assert authorizer.check("Bearer t-alice").code == 200
    for i in range(3 * webview.UNKNOWN_MAX):
        assert authorizer.check(f"Bearer random-{i}").code == 401
    assert authorizer.remembered() == (1, webview.UNKNOWN_MAX)
    reviews = len(api.bodies)
    assert authorizer.check("Bearer t-alice").code == 200  # still remembered: no new review
    recent = f"Bearer random-{3 * webview.UNKNOWN_MAX - 1}"
    assert authorizer.check(recent).code == 401  # the newest random one is still remembered
    assert len(api.bodies) == reviews


def test_known_verdicts_are_bounded_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(webview, "VERDICTS_MAX", 4)
    users = {f"t-{i}": f"user-{i}" for i in range(10)}
    api = ReviewApi(users, allowed=set(users.values()))
    authorizer = Authorizer(api, "gpuplace-system", "gpuplace-controller")  # type: ignore[arg-type]
    for token in users:
        assert authorizer.check(f"Bearer {token}").code == 200
    assert authorizer.remembered() == (4, 0)
    reviews = len(api.bodies)
    assert authorizer.check("Bearer t-9").code == 200  # among the four most recent
    assert len(api.bodies) == reviews
    assert authorizer.check("Bearer t-0").code == 200  # dropped: reviewed again
    assert len(api.bodies) == reviews + 2


def test_verdicts_expire(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(webview, "VERDICT_SECONDS", 0.0)
    api = ReviewApi({"t-alice": "alice"}, allowed={"alice"})
    authorizer = Authorizer(api, "gpuplace-system", "gpuplace-controller")  # type: ignore[arg-type]
    assert authorizer.check("Bearer t-alice").code == 200
    assert authorizer.check("Bearer t-alice").code == 200
    assert len(api.bodies) == 4


class SlowReviewApi(ReviewApi):
    """Holds every TokenReview until released, counting those in flight."""

    def __init__(self) -> None:
        super().__init__({}, allowed=set())
        self.release = threading.Event()
        self.lock = threading.Lock()
        self.inside = 0
        self.most = 0

    def create(self, path: str, body: dict[str, Any], **kw: Any) -> dict[str, Any]:
        with self.lock:
            self.inside += 1
            self.most = max(self.most, self.inside)
        try:
            self.release.wait(30)
            return super().create(path, body, **kw)
        finally:
            with self.lock:
                self.inside -= 1


def test_token_reviews_in_flight_are_capped() -> None:
    api = SlowReviewApi()
    registry = CollectorRegistry()
    authorizer = Authorizer(api, "gpuplace-system", "gpuplace-controller")  # type: ignore[arg-type]
    web = WebServer("127.0.0.1", 0, SOURCES, authorizer, ServerMetrics(registry)).start()
    results: list[int] = []

    def ask(i: int) -> None:
        results.append(request(web.port, token=f"random-{i}")[0])

    first = [threading.Thread(target=ask, args=(i,)) for i in range(webview.REVIEWS_IN_FLIGHT)]
    try:
        for t in first:
            t.start()
        for _ in range(3000):
            if api.inside == webview.REVIEWS_IN_FLIGHT:
                break
            threading.Event().wait(0.01)
        assert api.inside == webview.REVIEWS_IN_FLIGHT
        for i in range(5):
            status, body = request(web.port, token=f"other-{i}")
            assert status == 503 and "too many tokens" in body
        busy = registry.get_sample_value(
            "gpuplace_http_refused_total", {"server": "web", "reason": "busy"}
        )
        assert busy == 5
    finally:
        api.release.set()
        for t in first:
            t.join()
        web.stop()
    assert results == [401] * webview.REVIEWS_IN_FLIGHT
    assert api.most == webview.REVIEWS_IN_FLIGHT
