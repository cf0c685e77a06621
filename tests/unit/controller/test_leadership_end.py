"""Leadership ends before the lease does (docs/architecture.md, Threads): when the leader stops, its binder
stops sending and drains what is in flight, and only then is the Lease released; nothing is sent
after. The elector and the binder against the in-memory Lease store, a stepped clock and a
sender that holds every request in flight until it is drained."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import orjson

from controller.binder import Binder
from controller.metrics import ControllerMetrics
from controller.settings import BinderSettings
from kubeio.client import Response
from kubeio.errors import FencedError
from kubeio.events import EventRecorder
from kubeio.leader import LeaderElector
from kubeio.loop import Done
from kubeio.pod import Pod
from kubeio.requests import Request
from placement.annotations import MAP_LABEL
from placement.keyring import TrustView, new_ring
from tests.unit.controller.test_binder import Apiserver, make_pod
from tests.unit.kubeio.test_leader import PATH, Clock, Leases, elector
from tests.unit.placement.test_binding_plan import TWO_SLOTS, build


class Journal:
    """What happened, in order, across the sender and the Lease store."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.lock = threading.Lock()

    def add(self, line: str) -> None:
        with self.lock:
            self.lines.append(line)


class HeldSender:
    """Every request written is in flight (unanswered) until `drain`, which answers them and
    says whether all were (`answers`: False leaves them outstanding, as a drain that ran out of
    time does)."""

    def __init__(self, journal: Journal, answers: bool = True) -> None:
        self.journal = journal
        self.answers = answers
        self.draining = False
        self.in_flight: list[tuple[Request, Done]] = []

    def submit(self, request: Request, done: Done, guard: Callable[[], bool] | None = None) -> None:
        if self.draining or (guard is not None and not guard()):
            self.journal.add(f"refused {request.method} {request.path}")
            done(FencedError(0, "Fenced", "not sent"))
            return
        self.journal.add(f"sent {request.method} {request.path}")
        self.in_flight.append((request, done))

    def warm(self, count: int) -> None:
        pass

    def drain(self, timeout: float) -> bool:
        self.draining = True
        self.journal.add("drain")
        if not self.answers:
            return False
        for request, done in self.in_flight:
            self.journal.add(f"answered {request.method} {request.path}")
            assert request.body is not None
            done(Response(201, request.body))
        self.in_flight.clear()
        return True

    def close(self) -> None:
        self.journal.add("closed")

    def alive(self) -> bool:
        return True


class JournaledLeases(Leases):
    def put(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        stored = super().put(path, body)
        if path == PATH and body["spec"]["holderIdentity"] == "":
            self.journal.add("lease released")
        return stored

    journal: Journal


BINDING = "POST /api/v1/namespaces/ml/pods/web-0/binding"


def leader_with_a_binding_in_flight(
    answers: bool,
) -> tuple[LeaderElector, Binder, HeldSender, JournaledLeases, threading.Thread]:
    journal = Journal()
    leases, clock = JournaledLeases(), Clock()
    leases.journal = journal
    me = elector(leases, clock, retry=0.01)
    sender = HeldSender(journal, answers)
    api = Apiserver()
    binder = Binder(
        api,  # type: ignore[arg-type]
        BinderSettings(bind_workers=2),
        ControllerMetrics(),
        EventRecorder(api, "gpuplace"),  # type: ignore[arg-type]
        lambda: build(TWO_SLOTS),
        fence=me.holds,
        sender=lambda: sender,
    )
    binder.trust = TrustView.of(new_ring(b"k" * 32, "2026-01-01T00:00:00Z"))
    me.on_stopped = binder.stop
    thread = threading.Thread(target=me.run, daemon=True)
    thread.start()
    assert me.is_leader.wait(30)
    pod = make_pod("web-0").label(MAP_LABEL, "llm").obj()
    binder.on_pod("ADDED", Pod.of(pod))
    uid = binder.queue.pop(timeout=0)
    assert uid is not None
    binder._decide(uid, Pod.of(pod))
    assert journal.lines == [f"sent {BINDING}"]  # in flight
    return me, binder, sender, leases, thread


def test_the_lease_is_released_only_after_the_bindings_in_flight_are_answered() -> None:
    me, binder, sender, leases, thread = leader_with_a_binding_in_flight(answers=True)
    me.stop()
    thread.join(30)
    assert not thread.is_alive()
    assert sender.journal.lines == [
        f"sent {BINDING}",
        "drain",
        f"answered {BINDING}",
        "closed",
        "lease released",
    ]
    holding = binder.cache.holding("uid-web-0")
    assert holding is not None and not holding.assumed  # the answer confirmed it
    assert leases.spec()["holderIdentity"] == ""
    # Nothing goes out after the release.
    loop = sender
    body = orjson.dumps({"kind": "Binding"})
    refused: list[object] = []
    loop.submit(
        Request("POST", "/api/v1/namespaces/ml/pods/web-1/binding", body=body), refused.append
    )
    assert isinstance(refused[0], FencedError)


def test_a_drain_that_leaves_a_binding_unanswered_leaves_the_lease_to_expire() -> None:
    me, _binder, sender, leases, thread = leader_with_a_binding_in_flight(answers=False)
    me.stop()
    thread.join(30)
    assert not thread.is_alive()
    assert "lease released" not in sender.journal.lines
    assert sender.journal.lines[:2] == [f"sent {BINDING}", "drain"]
    assert leases.spec()["holderIdentity"] == "me"  # expires on its own, by the standby's clock
