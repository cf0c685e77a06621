"""Bindings sent by worker processes: the lease deadline each job carries, the answers the leader
reads back (and what the binder does with each), the room that paces its decisions, and a worker
that dies."""

from __future__ import annotations

import math
import os
import pickle
import signal
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from kubernetes import client as k8s_client

from controller.binder import Binder
from controller.bindprocs import (
    BindJob,
    BindProcesses,
    BindResult,
    KubeConnection,
    connection_of,
    error_of,
    open_client,
    send,
)
from kubeio.client import ClientSettings, Kube
from kubeio.errors import (
    APIConflictError,
    APIError,
    APINotFoundError,
    APIServerError,
    APITransportError,
    FencedError,
)
from kubeio.pod import Pod
from placement.annotations import verify_binding
from tests.unit.test_binder import KEY, SLOT0, WEB0, Apiserver, _placement_of, binder_for
from tests.unit.test_binding_plan import TWO_SLOTS, build


class Counting(ThreadingHTTPServer):
    """Answers every POST with 201 and counts them; `hold` keeps each answer until set."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.posts: list[str] = []
        self.arrived = threading.Event()
        self.hold = threading.Event()
        self.hold.set()


class _Handler(BaseHTTPRequestHandler):
    server: Counting
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.server.posts.append(self.path)
        self.server.arrived.set()
        self.server.hold.wait()
        body = b"{}"
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[Counting]:
    srv = Counting()
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.hold.set()
    srv.shutdown()
    srv.server_close()


def _connection(srv: Counting) -> KubeConnection:
    host, port = srv.server_address[:2]
    return KubeConnection(ClientSettings(), f"http://{host!s}:{port}")


def _job(name: str, deadline: float) -> BindJob:
    return BindJob(deadline, name, "ml", f"uid-{name}", "gpu-1", {"gpuplace.io/node": "gpu-1"})


class Outcomes:
    def __init__(self) -> None:
        self.got: list[APIError | None] = []
        self.changed = threading.Condition()

    def done(self, error: APIError | None) -> None:
        with self.changed:
            self.got.append(error)
            self.changed.notify_all()

    def wait_for(self, count: int) -> list[APIError | None]:
        with self.changed:
            assert self.changed.wait_for(lambda: len(self.got) >= count, timeout=60)
            return list(self.got)


def test_a_job_past_its_deadline_is_never_sent(server: Counting) -> None:
    kube = open_client(_connection(server), 1)
    assert send(kube, 7, _job("late", time.monotonic() - 1.0))[:3] == (7, 0, "Fenced")
    assert server.posts == []
    assert send(kube, 8, _job("web-0", math.inf)) == (8, 201, "Created", "")
    assert server.posts == ["/api/v1/namespaces/ml/pods/web-0/binding"]


def test_worker_processes_bind_live_jobs_and_fence_lapsed_ones(server: Counting) -> None:
    pool = BindProcesses(_connection(server), processes=2, in_flight=2)
    outcomes = Outcomes()
    try:
        pool.submit(_job("late-0", time.monotonic() - 1.0), outcomes.done)
        pool.submit(_job("late-1", -math.inf), outcomes.done)
        for i in range(4):
            pool.submit(_job(f"web-{i}", math.inf), outcomes.done)
        got = outcomes.wait_for(6)
    finally:
        pool.close()
    assert sorted(server.posts) == [f"/api/v1/namespaces/ml/pods/web-{i}/binding" for i in range(4)]
    assert got.count(None) == 4
    assert [type(e) for e in got if e is not None] == [FencedError, FencedError]


def test_a_worker_that_dies_fails_its_jobs_back_and_is_replaced(server: Counting) -> None:
    server.hold.clear()  # the Binding reaches the server and waits for its answer
    pool = BindProcesses(_connection(server), processes=1, in_flight=1)
    outcomes = Outcomes()
    try:
        pool.submit(_job("web-0", math.inf), outcomes.done)
        assert server.arrived.wait(60)
        [pid] = pool.pids()
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        [error] = outcomes.wait_for(1)
        assert isinstance(error, APITransportError)
        assert pool.restarts == 1 and pool.pids() != [pid]
        server.hold.set()
        pool.submit(_job("web-1", math.inf), outcomes.done)
        assert outcomes.wait_for(2)[1] is None
    finally:
        pool.close()


def test_the_processes_have_room_once_started_and_again_as_answers_come_back(
    server: Counting,
) -> None:
    """One process with one Binding in flight takes two jobs unanswered, once it has started; a
    third waits for an answer, so that no job's deadline is spent in a queue."""
    server.hold.clear()
    pool = BindProcesses(_connection(server), processes=1, in_flight=1)
    outcomes = Outcomes()
    try:
        assert not pool.wait_for_room(0)  # the process is still starting (a fresh interpreter)
        assert pool.wait_for_room(60)
        for i in range(2):
            pool.submit(_job(f"web-{i}", math.inf), outcomes.done)
        assert server.arrived.wait(60)
        assert not pool.wait_for_room(0.2)
        server.hold.set()
        assert pool.wait_for_room(60)
        assert outcomes.wait_for(2) == [None, None]
    finally:
        pool.close()
    assert pool.wait_for_room(0)  # closed: a job submitted now is failed back at once


@pytest.mark.parametrize(
    ("result", "kind"),
    [
        ((1, 201, "Created", ""), None),
        ((1, 404, "NotFound", "pod gone"), APINotFoundError),
        ((1, 409, "Conflict", "already bound"), APIConflictError),
        ((1, 500, "InternalError", "etcd timeout"), APIServerError),
        ((1, 0, "Fenced", "deadline passed"), FencedError),
        ((1, 0, "Transport", "connection reset"), APITransportError),
    ],
)
def test_each_answer_becomes_the_error_the_leader_would_have_raised(
    result: BindResult, kind: type[APIError] | None
) -> None:
    error = error_of(result)
    if kind is None:
        assert error is None
    else:
        assert type(error) is kind and error is not None and error.message == result[3]


class Pool:
    """Takes the binder's jobs; the test answers them."""

    def __init__(self) -> None:
        self.jobs: list[tuple[BindJob, Any]] = []

    def submit(self, job: BindJob, done: Any) -> None:
        self.jobs.append((job, done))


class Full(Pool):
    """A pool whose processes have no room until `room` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.room = threading.Event()
        self.asked = threading.Event()

    def wait_for_room(self, timeout: float) -> bool:
        self.asked.set()
        return self.room.wait(timeout)

    def close(self) -> None:
        pass


def test_the_leader_decides_no_pod_while_the_processes_have_no_room() -> None:
    binder = binder_for(Apiserver(), build(TWO_SLOTS))
    pool = Full()
    binder._procs = pool  # type: ignore[assignment]
    binder.on_pod("ADDED", Pod.of(WEB0()))
    binder.start()
    try:
        assert pool.asked.wait(10)
        time.sleep(0.3)
        assert pool.jobs == [] and binder.cache.holding("uid-web-0") is None
        pool.room.set()
        deadline = time.monotonic() + 10
        while not pool.jobs and time.monotonic() < deadline:
            time.sleep(0.01)
        [(job, _done)] = pool.jobs
        assert job.name == "web-0" and binder.cache.holding("uid-web-0") is not None
    finally:
        binder.stop()


def _handed_over(deadline: float) -> tuple[Binder, BindJob, Any]:
    binder = binder_for(Apiserver(), build(TWO_SLOTS))
    binder.lease_deadline = lambda: deadline
    pool = Pool()
    binder._procs = pool  # type: ignore[assignment]
    binder.on_pod("ADDED", Pod.of(WEB0()))
    uid = binder.queue.pop(timeout=0)
    assert uid == "uid-web-0"
    binder._decide(uid, Pod.of(WEB0()))
    [(job, done)] = pool.jobs
    return binder, job, done


def test_the_leader_signs_each_job_and_stamps_the_lease_deadline() -> None:
    _binder, job, _done = _handed_over(1234.5)
    assert job.deadline == 1234.5
    assert (job.name, job.namespace, job.uid, job.node) == ("web-0", "ml", "uid-web-0", "gpu-1")
    assert verify_binding(KEY, "uid-web-0", "ml", job.annotations)


@pytest.mark.parametrize(
    ("result", "holds", "requeued", "label"),
    [
        ((0, 201, "Created", ""), True, 0, "bound"),
        ((0, 409, "Conflict", "already bound"), False, 0, "conflict"),
        ((0, 404, "NotFound", "pod gone"), False, 0, "conflict"),
        ((0, 500, "InternalError", "etcd timeout"), False, 1, "error"),
        ((0, 0, "Transport", "bind process exited"), False, 1, "error"),
        ((0, 0, "Fenced", "deadline passed"), False, 1, "fenced"),
    ],
)
def test_the_slot_cache_learns_each_answer(
    result: BindResult, holds: bool, requeued: int, label: str
) -> None:
    binder, _job, done = _handed_over(math.inf)
    held = binder.cache.holding("uid-web-0")
    assert held is not None and held.assumed
    done(error_of(result))
    held = binder.cache.holding("uid-web-0")
    if holds:
        assert held is not None and not held.assumed and held.slot == SLOT0
    else:
        assert held is None and binder.cache.slot_holder(SLOT0) is None  # assume -> forget
    assert len(binder.queue) == requeued  # a fenced pod waits for the lease, an error backs off
    assert binder.metrics.binds.labels(label)._value.get() == 1
    assert "uid-web-0" not in binder._in_flight


def test_a_worker_opens_a_client_like_the_leaders() -> None:
    config = k8s_client.Configuration()
    config.host = "https://10.0.0.1:6443"
    config.verify_ssl = False
    config.tls_server_name = "kubernetes.default"
    config.api_key = {"BearerToken": "abc"}
    config.api_key_prefix = {"BearerToken": "Bearer"}
    leader = Kube(config, ClientSettings(kubeconfig="/k", user_agent="gpuplace-controller/a"))
    connection = connection_of(leader)
    assert not connection.reload  # a fixed token: copied, not loaded again
    worker = open_client(pickle.loads(pickle.dumps(connection)), 4)
    assert worker.host == "https://10.0.0.1:6443" and worker.settings.qps_pool == 4
    assert worker.configuration.tls_server_name == "kubernetes.default"
    assert worker._headers(None)["Authorization"] == "Bearer abc"
    assert worker._headers(None)["User-Agent"] == "gpuplace-controller/a"


def test_a_refreshed_token_is_loaded_again_by_each_worker() -> None:
    config = k8s_client.Configuration()
    config.host = "https://10.0.0.1:6443"
    # As load_incluster_config installs it.
    config.refresh_api_key_hook = lambda _c: None  # type: ignore[assignment]
    connection = connection_of(Kube(config, ClientSettings()))
    assert connection.reload
    pickle.dumps(connection)  # the hook stays with the leader: the worker re-reads the file


class Claims:
    """The claim writer of dra enforcement: records Reserve and its undoing."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def reserve(self, claim: object, pod: Pod) -> None:
        self.calls.append(f"reserve {pod.name}")

    def unreserve(self, claim: object) -> None:
        self.calls.append("unreserve")


def test_in_dra_the_claim_is_reserved_by_the_leader_before_the_binding_goes_out() -> None:
    binder = binder_for(Apiserver(), build(TWO_SLOTS))
    claims, pool = Claims(), Pool()
    binder.claims = claims  # type: ignore[assignment]
    binder._procs = pool  # type: ignore[assignment]
    binder.on_pod("ADDED", Pod.of(WEB0()))
    uid = binder.queue.pop(timeout=0)
    assert uid == "uid-web-0"
    placement = _placement_of(binder, WEB0())
    binder.cache.assume(uid, "ml/web-0", placement)
    binder._bind(uid, Pod.of(WEB0()), placement, object())  # type: ignore[arg-type]
    [(job, done)] = pool.jobs
    assert claims.calls == ["reserve web-0"] and job.name == "web-0"
    done(error_of((0, 404, "NotFound", "pod gone")))  # a deleted pod loses its claim too
    assert claims.calls == ["reserve web-0", "unreserve"]
    assert binder.cache.holding(uid) is None
