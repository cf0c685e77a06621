"""Leader election on a coordination.k8s.io Lease, as client-go does it.

Expiry is judged by the local clock from when this process last saw the record change, never from
the remote renewTime, so clock skew between replicas cannot make two leaders.

Fencing: a leader counts as holding the lease only until `renew_deadline_seconds` after the start
of its last successful renewal, by the local monotonic clock (which keeps running while the process
is paused). A standby takes over no sooner than `lease_seconds` after it saw that renewal, so the
leader's writes checked against `holds()` stop before another replica's can begin, whatever
paused the leader (a slow start-up, a stopped process, a partition). Start-up runs on its own
thread while this one keeps renewing.

Leadership ends before the lease does: when it ends (lost, or given up on `stop`), `holds()` turns
False first, then `on_stopped` stops the leader's writers and waits, bounded, for what they sent;
the lease is released only after that, and only when it says that nothing is still in flight
(otherwise it is left to expire). So no write of the old leader's reaches the apiserver once a
standby may take the lease at once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from kubeio import bodies
from kubeio.client import Kube, Obj
from kubeio.errors import APIConflictError, APIError, APINotFoundError
from kubeio.paths import LEASES
from kubeio.times import now_micro

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LeaderSettings:
    namespace: str
    name: str
    identity: str
    lease_seconds: float = 15.0
    renew_deadline_seconds: float = 10.0
    retry_seconds: float = 2.0


class LeaseHold:
    """Whether this process holds the lease right now: written by the elector alone, read by every
    leader write's fence from any thread (an Event and one float, no lock needed). Built before the
    elector, so that what fences on it (the binder, the model keeper, the status writer) is given it
    when it is built, whatever order the elector's own callbacks need."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.is_leader = threading.Event()
        self.held_until = 0.0  # monotonic; see holds()

    def holds(self) -> bool:
        """Whether this process may act as the leader right now: check it immediately before
        each write that only the leader may make."""
        return self.is_leader.is_set() and self.clock() < self.held_until


class LeaderElector:
    """Campaigns for and renews one Lease.

    Contract: `run` is the only writer of the lease and of `_observed`/`_held_until`, on its own
    thread; `holds()` and `is_leader` are read by any thread (an Event and one float, no lock
    needed). `on_started` runs on a thread of its own once leading; `on_stopped` runs on `run`'s
    thread when leadership ends, after `is_leader` is cleared, and returns whether every write of
    the leadership has ended. `stop()` ends `run`, which then releases the lease if it did.
    """

    def __init__(
        self,
        kube: Kube,
        settings: LeaderSettings,
        on_started: Callable[[], None],
        on_stopped: Callable[[], bool],
        clock: Callable[[], float] = time.monotonic,
        hold: LeaseHold | None = None,
    ) -> None:
        self.kube = kube
        #: what `holds()` reads (shared with the leader's writers when given)
        self.hold = hold if hold is not None else LeaseHold(clock)
        self._clock = self.hold.clock  # monotonic seconds; tests step it
        self.s = settings
        self.on_started = on_started
        self.on_stopped = on_stopped
        self.is_leader = self.hold.is_leader
        self._stop = threading.Event()
        self._observed: tuple[str, str] = ("", "")  # (holder, renewTime) last seen
        self._observed_at = 0.0
        #: The Lease as this process last wrote it (None when not holding): a renewal writes it
        #: again at once, with its resourceVersion, instead of reading it first; one request
        #: instead of two on an apiserver that may be answering slowly.
        self._written: Obj | None = None
        #: monotonic time of the loop's last campaign or renewal attempt (for /healthz)
        self.last_attempt = self._clock()
        self._path = LEASES.collection(settings.namespace)
        self._item = LEASES.item(settings.name, settings.namespace)

    def stop(self) -> None:
        self._stop.set()

    @property
    def _held_until(self) -> float:
        return self.hold.held_until

    @_held_until.setter
    def _held_until(self, value: float) -> None:
        self.hold.held_until = value

    def holds(self) -> bool:
        """Whether this process may act as the leader right now: check it immediately before
        each write that only the leader may make."""
        return self.hold.holds()

    def _renew(self) -> bool:
        started = self._clock()
        if not self._try_acquire():
            return False
        self._held_until = started + self.s.renew_deadline_seconds
        return True

    def run(self) -> None:
        """Blocks: campaigns, leads until the lease is lost or stop() is called, then returns.

        `on_started` runs on a thread of its own, so that the lease is renewed during a start-up
        (informer sync, compile, cache rebuild) that takes longer than the lease."""
        while not self._stop.is_set() and not self._renew():
            self._stop.wait(self.s.retry_seconds)
        if self._stop.is_set():
            return
        self.is_leader.set()
        log.info("became leader", extra={"lease": self.s.name, "identity": self.s.identity})
        threading.Thread(target=self.on_started, name="leader-start-up", daemon=True).start()
        try:
            while not self._stop.wait(self.s.retry_seconds):
                if self._renew():
                    continue
                holder = self._observed[0]
                if holder and holder != self.s.identity:
                    log.error(
                        "lost leadership: %s holds the lease",
                        holder,
                        extra={"lease": self.s.name},
                    )
                    break
                if self._clock() >= self._held_until:
                    log.error(
                        "lost leadership: the lease was not renewed within %.1f s",
                        self.s.renew_deadline_seconds,
                        extra={"lease": self.s.name},
                    )
                    break
        finally:
            self.is_leader.clear()  # holds() is False from here: no new leader write starts
            self._written = None
            ended = self.on_stopped()
            if self._stop.is_set():
                if ended:
                    self._release()
                else:
                    log.warning(
                        "writes of the leadership still unanswered: the lease is not released, "
                        "it expires in %.0f s",
                        self.s.lease_seconds,
                        extra={"lease": self.s.name},
                    )

    def _spec(self, acquire_time: str | None, transitions: int) -> Obj:
        now = now_micro()
        duration = int(self.s.lease_seconds)
        return bodies.lease_spec(self.s.identity, duration, acquire_time or now, now, transitions)

    def _try_acquire(self) -> bool:
        self.last_attempt = self._clock()
        if self._written is not None:
            # Renew the Lease as this process last wrote it; a 409 means someone else wrote it
            # since: read it and decide as a candidate.
            spec = self._written.get("spec", {})
            transitions = int(spec.get("leaseTransitions") or 0)
            renewed = self._put(
                {**self._written, "spec": self._spec(spec.get("acquireTime"), transitions)}
            )
            if renewed is not None:
                return renewed
        try:
            lease = self.kube.get(self._item)
        except APINotFoundError:
            body = bodies.lease(self.s.name, self.s.namespace, self._spec(None, 0))
            try:
                self._written = self.kube.create(self._path, body)
                return True
            except APIError as exc:
                log.info("lease create failed: %s", exc)
                return False
        except APIError as exc:
            log.warning("lease read failed: %s", exc)
            return False
        spec = lease.get("spec", {})
        holder = spec.get("holderIdentity") or ""
        record = (holder, str(spec.get("renewTime", "")))
        if record != self._observed:
            self._observed = record
            self._observed_at = self._clock()
        duration = float(spec.get("leaseDurationSeconds") or self.s.lease_seconds)
        expired = self._clock() - self._observed_at > duration
        if holder and holder != self.s.identity and not expired:
            return False
        transitions = int(spec.get("leaseTransitions") or 0) + (
            0 if holder == self.s.identity else 1
        )
        acquire = spec.get("acquireTime") if holder == self.s.identity else None
        lease["spec"] = self._spec(acquire, transitions)
        return self._put(lease) is True

    def _put(self, lease: Obj) -> bool | None:
        """Writes the Lease (with the resourceVersion it carries): True when written, None when
        someone else wrote it since (409), False when the write failed otherwise."""
        try:
            self._written = self.kube.put(self._item, lease)
        except APIConflictError:
            self._written = None
            return None
        except APIError as exc:
            log.warning("lease update failed: %s", exc)
            return False
        return True

    def _release(self) -> None:
        """Gives the lease up on a clean stop so a standby takes over at once."""
        try:
            lease = self.kube.get(self._item)
            if lease.get("spec", {}).get("holderIdentity") != self.s.identity:
                return
            lease["spec"]["holderIdentity"] = ""
            lease["spec"]["leaseDurationSeconds"] = 1
            self.kube.put(self._item, lease)
        except APIError as exc:
            log.info("lease release failed: %s", exc)
