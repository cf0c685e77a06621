"""The delete-protection finalizer of gpuplace's claims, written when the claim is first seen.

A claim must carry `DELETE_PROTECTION` before it is allocated, so that it cannot vanish while it
holds devices (kube-controller-manager removes the finalizer once the pod is done or gone, and on a
claim deleted before its allocation). The status subresource ignores metadata, so the finalizer
is a write of its own; written on the Binding path it makes three writes per pod where a client
that only allocates and binds makes two. Here it is written as soon as the claims informer shows
a claim generated from gpuplace's template for a pod the binder serves, on threads of its own,
while the pod normally still waits for something else; `protect` (the bind path's Reserve) then
finds it done and writes only the status. Correctness never depends on the early write: a claim
seen only at bind time is protected there, by `protect`, as before.

Every write carries the resourceVersion it was planned from. A record of each write (from version
-> to version) stays until the claim is deleted, so a Reserve planned from the version before the
finalizer uses the version after it: the only change in between is the finalizer, and any other
change still fails the status write with a conflict.

Contract: `want` and `gone` are called by the claims and pods informer threads, `start` and `stop`
by the binder (leader only: nothing is queued before `start` or after `stop`), `protect` by the
binder's side threads (a Reserve's writes before its status); the early writes run on `workers`
threads of their own. `_lock` guards `_writes`. Each
claim version is written at most once: a write queued and not started yet is taken over by
`protect`, one in flight is waited for.
"""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from kubeio.client import Kube
from kubeio.errors import APIConflictError, APIError, FencedError
from kubeio.paths import RESOURCE_CLAIMS
from placement.dra import DELETE_PROTECTION, ClaimState

log = logging.getLogger(__name__)
ClaimKey = tuple[str, str]  # (namespace, name)
#: The longest a Reserve waits for the early write of its claim before writing it itself.
WAIT_SECONDS = 30.0


class Stage(enum.Enum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


class When(enum.StrEnum):
    """Where a finalizer was written (the label of its metric)."""

    SEEN = "seen"  # early, when the claim was first seen
    BIND = "bind"  # on the Binding path: the claim was seen only then


@dataclass(eq=False)
class _Write:
    """One finalizer write of one claim version."""

    claim: ClaimState
    from_version: str
    stage: Stage
    to_version: str | None = None
    finished: threading.Event = field(default_factory=threading.Event)


def needs_protection(claim: ClaimState) -> bool:
    return DELETE_PROTECTION not in claim.finalizers and not claim.deleting


class ClaimFinalizers:
    def __init__(
        self,
        kube: Kube,
        *,
        fence: Callable[[], bool],
        serves: Callable[[str], bool],
        latest: Callable[[ClaimKey], ClaimState | None],
        count: Callable[[When], None],
        workers: int = 16,
        submit: Callable[..., object] | None = None,  # runs a call elsewhere (tests: inline)
    ) -> None:
        self.kube = kube
        self.fence = fence  # whether this process holds the leader's Lease now
        self._serves = serves  # whether a pod uid is one the binder serves
        self._latest = latest  # the claims informer's newest view of a claim
        self._count = count
        self._executor: ThreadPoolExecutor | None = None
        if submit is None:
            self._executor = ThreadPoolExecutor(workers, thread_name_prefix="claim-finalizer")
            submit = self._submit_to_executor
        self._submit = submit
        self._lock = threading.Lock()
        self._writes: dict[ClaimKey, _Write] = {}
        self._running = False

    # -- feeding (informer threads, the binder's start) -----------------------------------------
    def start(self, unprotected: Iterable[ClaimState]) -> None:
        """Leading: protects from now on, beginning with the claims seen before."""
        with self._lock:
            self._running = True
        for claim in unprotected:
            self.want(claim)

    def stop(self) -> None:
        with self._lock:
            self._running = False
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)

    def _submit_to_executor(self, fn: Callable[..., object], *args: object) -> None:
        assert self._executor is not None
        try:
            future = self._executor.submit(fn, *args)
        except RuntimeError:
            return  # stopped: nothing is written after `stop`
        future.add_done_callback(_log_failure)

    def want(self, claim: ClaimState) -> None:
        """A claim generated from gpuplace's template was seen: queued once if it lacks the
        finalizer and its pod is one the binder serves."""
        if not needs_protection(claim) or not claim.owner_uid or not self._serves(claim.owner_uid):
            return
        version = claim.resource_version
        with self._lock:
            if not self._running:
                return
            write = self._writes.get(claim.key)
            if write is not None:
                if write.from_version == version or write.stage is Stage.RUNNING:
                    return  # queued, written or being written (after a conflict: looked again)
                if write.stage is Stage.QUEUED:
                    write.claim, write.from_version = claim, version  # not started yet
                    return
            self._writes[claim.key] = _Write(claim, version, Stage.QUEUED)
        self._submit(self._run, claim.key)

    def gone(self, key: ClaimKey) -> None:
        """The claim was deleted: its record goes (a write queued for it is skipped)."""
        with self._lock:
            self._writes.pop(key, None)

    def pending(self) -> int:
        """Writes queued or running (for tests and the bench's logs)."""
        with self._lock:
            return sum(w.stage in (Stage.QUEUED, Stage.RUNNING) for w in self._writes.values())

    # -- writing: the early writes (own workers) --------------------------------------------------
    def _run(self, key: ClaimKey) -> None:
        latest = self._latest(key)
        with self._lock:
            write = self._writes.get(key)
            if write is None or write.stage is not Stage.QUEUED:
                return  # gone, or taken over by a Reserve
            if latest is None or not needs_protection(latest):
                del self._writes[key]  # gone, or protected meanwhile
                write.finished.set()
                return
            write.claim, write.from_version = latest, latest.resource_version
            write.stage = Stage.RUNNING
        try:
            if not self.fence():
                raise FencedError(0, "Fenced", "lease not held")
            to_version = self._patch(write.claim, write.from_version)
        except APIError as exc:
            self._finish(write, None)
            log.debug("finalizer of claim %s/%s not written: %s", *key, exc)
            if isinstance(exc, APIConflictError):
                newer = self._latest(key)  # changed meanwhile: the newer version, if it needs it
                if newer is not None and newer.resource_version != write.from_version:
                    self.want(newer)
            return
        self._finish(write, to_version)
        self._count(When.SEEN)

    # -- writing: the bind path (the binder's side threads) -----------------------------------
    def protect(self, claim: ClaimState, version: str) -> str:
        """Makes sure the claim, as of `version` (what a Reserve planned from), carries the
        finalizer; returns the version the claim's status write must carry. Raises the APIError
        of a write refused (a conflict: the claim changed since `version`)."""
        taken = False
        with self._lock:
            write = self._writes.get(claim.key)
            if write is not None and write.from_version == version:
                if write.stage is Stage.DONE and write.to_version is not None:
                    return write.to_version
                if write.stage is not Stage.RUNNING:
                    write.stage, taken = Stage.RUNNING, True  # the worker skips it
            else:
                write = None
        if write is not None and taken:
            return self._write_here(write)
        if write is not None:
            # Being written by the early writer (or another Reserve): one round trip at most.
            write.finished.wait(WAIT_SECONDS)
            with self._lock:
                if write.stage is Stage.DONE and write.to_version is not None:
                    return write.to_version
        # Not written from this version (a claim seen only now, an allocation just cleared, an
        # early write that failed): written here, a conflict refusing it as it would the status.
        mine = _Write(claim, version, Stage.RUNNING)
        with self._lock:
            self._writes[claim.key] = mine
        return self._write_here(mine)

    def _write_here(self, write: _Write) -> str:
        try:
            to_version = self._patch(write.claim, write.from_version)
        except APIError:
            self._finish(write, None)
            raise
        self._finish(write, to_version)
        self._count(When.BIND)
        return to_version

    def _finish(self, write: _Write, to_version: str | None) -> None:
        with self._lock:
            write.stage = Stage.FAILED if to_version is None else Stage.DONE
            write.to_version = to_version
        write.finished.set()

    def _patch(self, claim: ClaimState, version: str) -> str:
        return add_finalizer(self.kube, claim, version)


def add_finalizer(kube: Kube, claim: ClaimState, version: str) -> str:
    """Adds the finalizer to the claim as of `version`, as kube-scheduler does before it
    allocates; returns the claim's new resourceVersion (raises APIConflictError when the claim
    changed since `version`)."""
    written = kube.patch(
        RESOURCE_CLAIMS.item(claim.name, claim.namespace),
        {
            "metadata": {
                "resourceVersion": version,
                "finalizers": [*claim.finalizers, DELETE_PROTECTION],
            }
        },
    )
    return str(written["metadata"]["resourceVersion"])


def _log_failure(future: Future[object]) -> None:
    error = future.exception() if not future.cancelled() else None
    if error is not None:
        log.error("a claim finalizer write failed", exc_info=error)
