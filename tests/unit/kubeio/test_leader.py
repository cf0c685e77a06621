"""LeaderElector against an in-memory Lease store (a fake at gpuplace's own boundary, `Kube`) and a
stepped clock: acquire, renew, expiry, takeover, fencing, renew failure, release."""

from __future__ import annotations

import copy
import threading
from typing import Any

from kubeio.errors import APIConflictError, APIError, APINotFoundError
from kubeio.leader import LeaderElector, LeaderSettings

PATH = "/apis/coordination.k8s.io/v1/namespaces/gpuplace-system/leases/gpuplace-controller"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Leases:
    """Lease objects by path, with resourceVersion conflicts, and failures on demand."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.version = 0
        self.fail_next: list[APIError] = []
        self.lock = threading.Lock()

    def _fail(self) -> None:
        if self.fail_next:
            raise self.fail_next.pop(0)

    def get(self, path: str, **_query: Any) -> dict[str, Any]:
        with self.lock:
            self._fail()
            if path not in self.objects:
                raise APINotFoundError(404, "NotFound", "not found")
            return copy.deepcopy(self.objects[path])

    def create(self, path: str, body: dict[str, Any], guard: Any = None) -> dict[str, Any]:
        with self.lock:
            self._fail()
            full = f"{path}/{body['metadata']['name']}"
            if full in self.objects:
                raise APIConflictError(409, "AlreadyExists", "exists")
            return self._store(full, body)

    def put(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            self._fail()
            seen = body["metadata"].get("resourceVersion")
            if seen != self.objects[path]["metadata"]["resourceVersion"]:
                raise APIConflictError(409, "Conflict", "the object has been modified")
            return self._store(path, body)

    def _store(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        stored = copy.deepcopy(body)
        stored["metadata"]["resourceVersion"] = str(self.version)
        self.objects[path] = stored
        return copy.deepcopy(stored)

    def spec(self) -> dict[str, Any]:
        return self.objects[PATH]["spec"]

    def take_over(self, holder: str, stamp: str) -> None:
        """Another replica writes the lease whatever its version (a new resourceVersion)."""
        with self.lock:
            obj = copy.deepcopy(self.objects[PATH])
            obj["spec"].update(holderIdentity=holder, renewTime=stamp)
            self._store(PATH, obj)

    def renew_as(self, holder: str, stamp: str) -> None:
        """Another replica writes the lease."""
        obj = self.get(PATH)
        obj["spec"].update(holderIdentity=holder, renewTime=stamp)
        self.put(PATH, obj)


def elector(
    leases: Leases, clock: Clock, identity: str = "me", retry: float = 2.0
) -> LeaderElector:
    settings = LeaderSettings(
        "gpuplace-system",
        "gpuplace-controller",
        identity,
        lease_seconds=15.0,
        renew_deadline_seconds=10.0,
        retry_seconds=retry,
    )
    return LeaderElector(leases, settings, lambda: None, lambda: True, clock=clock)  # type: ignore[arg-type]


def test_no_lease_is_created_held_by_us_and_fences_after_the_renew_deadline() -> None:
    leases, clock = Leases(), Clock()
    me = elector(leases, clock)
    assert me._renew()
    assert leases.spec()["holderIdentity"] == "me"
    assert leases.spec()["leaseTransitions"] == 0
    me.is_leader.set()
    clock.now += 9.9
    assert me.holds()
    clock.now += 0.2  # past the renew deadline without a renewal: no more leader writes
    assert not me.holds()
    assert me._renew()  # a renewal extends it from the renewal's start
    assert me.holds()


def test_holds_until_the_renewals_start_plus_the_deadline_and_never_when_not_leading() -> None:
    leases, clock = Leases(), Clock()
    me = elector(leases, clock)
    assert me._renew()
    assert not me.holds()  # renewed, but not leading (yet)
    me.is_leader.set()
    clock.now = 1009.9  # the renewal's start + renew_deadline_seconds is 1010
    assert me.holds()
    clock.now = 1010.0
    assert not me.holds()
    clock.now = 1005.0
    me.is_leader.clear()
    assert not me.holds()


def test_a_fresh_lease_of_another_is_respected_until_it_expires_by_our_clock() -> None:
    leases, clock = Leases(), Clock()
    assert elector(leases, clock, "other")._renew()
    me = elector(leases, clock)
    assert not me._renew()
    clock.now += 15.0  # exactly the lease duration since we saw it change: not yet expired
    assert not me._renew()
    clock.now += 0.1
    assert me._renew()
    spec = leases.spec()
    assert spec["holderIdentity"] == "me" and spec["leaseTransitions"] == 1


def test_a_holder_that_keeps_renewing_never_expires_however_far_its_clock_is() -> None:
    leases, clock = Leases(), Clock()
    assert elector(leases, clock, "other")._renew()
    me = elector(leases, clock)
    for i in range(10):
        assert not me._renew()
        clock.now += 10.0
        # The other replica's clock may say anything: only a change counts, never its value.
        leases.renew_as("other", f"1970-01-01T00:00:{i:02d}.000000Z")
    assert not me._renew()


def test_renewing_our_own_lease_keeps_acquire_time_and_transitions() -> None:
    leases, clock = Leases(), Clock()
    me = elector(leases, clock)
    assert me._renew()
    acquired = leases.spec()["acquireTime"]
    clock.now += 2
    assert me._renew()
    assert leases.spec()["acquireTime"] == acquired
    assert leases.spec()["leaseTransitions"] == 0


def test_a_failed_or_conflicting_renewal_is_no_renewal_and_the_fence_stands() -> None:
    leases, clock = Leases(), Clock()
    me = elector(leases, clock)
    assert me._renew()
    me.is_leader.set()
    held_until = me._held_until
    leases.fail_next = [APIError(500, "InternalError", "etcd timeout")]
    clock.now += 5
    assert not me._renew()
    leases.renew_as("me", "2026-01-01T00:00:00.000000Z")  # the lease moved under us
    stale = leases.get(PATH)
    leases.renew_as("me", "2026-01-01T00:00:01.000000Z")
    leases.fail_next = []
    assert me._held_until == held_until
    # A write with an old resourceVersion conflicts: the elector reports no renewal.
    original_get = leases.get
    leases.get = lambda path, **q: copy.deepcopy(stale)  # type: ignore[method-assign]
    assert not me._renew()
    leases.get = original_get  # type: ignore[method-assign]
    clock.now += 5.1
    assert not me.holds()


def test_release_gives_up_only_our_own_lease() -> None:
    leases, clock = Leases(), Clock()
    me = elector(leases, clock)
    assert me._renew()
    me._release()
    assert leases.spec()["holderIdentity"] == ""
    assert leases.spec()["leaseDurationSeconds"] == 1
    other = elector(leases, clock, "other")
    assert other._renew()  # a released lease is taken at once
    me._release()
    assert leases.spec()["holderIdentity"] == "other"


def run_in_thread(me: LeaderElector) -> threading.Thread:
    thread = threading.Thread(target=me.run, daemon=True)
    thread.start()
    assert me.is_leader.wait(30)
    return thread


def leading_in_thread(
    leases: Leases, clock: Clock
) -> tuple[LeaderElector, threading.Event, threading.Thread]:
    """An elector leading in a thread of its own, and the event it sets when it stops leading."""
    stopped = threading.Event()
    me = elector(leases, clock, retry=0.01)

    def on_stopped() -> bool:
        stopped.set()
        return True

    me.on_stopped = on_stopped
    return me, stopped, run_in_thread(me)


def test_run_leads_then_stops_cleanly_and_releases() -> None:
    leases, clock = Leases(), Clock()
    events: list[str] = []
    me = elector(leases, clock, retry=0.01)
    me.on_started = lambda: events.append("started")
    me.on_stopped = lambda: events.append("stopped") or True
    thread = run_in_thread(me)
    me.stop()
    thread.join(30)
    assert not thread.is_alive()
    assert not me.is_leader.is_set()
    assert events[-1] == "stopped" and "started" in events
    assert leases.spec()["holderIdentity"] == ""


def test_run_steps_down_when_another_holds_the_lease_and_does_not_release_it() -> None:
    leases, clock = Leases(), Clock()
    me, stopped, thread = leading_in_thread(leases, clock)
    # Another replica took the lease (it judged ours expired): we see a fresh record of it.
    clock.now += 100
    leases.take_over("other", "x")
    assert stopped.wait(30)
    thread.join(30)
    assert not me.is_leader.is_set() and not me.holds()
    assert leases.spec()["holderIdentity"] == "other"


def test_run_steps_down_when_renewals_fail_past_the_deadline() -> None:
    leases, clock = Leases(), Clock()
    me, stopped, thread = leading_in_thread(leases, clock)
    leases.fail_next = [APIError(500, "InternalError", "apiserver down")] * 100_000
    clock.now += 10.0  # the renew deadline passes without a successful renewal
    assert stopped.wait(30)
    thread.join(30)
    assert not me.holds()


def test_a_renewal_writes_the_lease_it_wrote_last_without_reading_it_first() -> None:
    leases, clock = Leases(), Clock()
    me = elector(leases, clock)
    reads: list[str] = []
    get = leases.get

    def counting_get(path: str, **query: Any) -> dict[str, Any]:
        reads.append(path)
        return get(path, **query)

    leases.get = counting_get  # type: ignore[method-assign]
    assert me._renew()  # acquires: reads first (404), then creates
    first = leases.objects[PATH]["metadata"]["resourceVersion"]
    reads.clear()
    clock.now += 1
    assert me._renew() and me._renew()
    assert reads == []  # two renewals, two writes, no read
    assert leases.objects[PATH]["metadata"]["resourceVersion"] != first
    assert leases.spec()["holderIdentity"] == "me"

    # Another replica wrote it meanwhile: the write conflicts, the elector reads and sees it.
    leases.take_over("other", "2026-11-26T00:00:00.000000Z")
    assert not me._renew()
    assert reads == [PATH]
    assert leases.spec()["holderIdentity"] == "other"
