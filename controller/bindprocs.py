"""Binding calls sent by worker processes, for a leader whose one interpreter lock caps it.

The leader decides and signs (an HMAC of a few hundred bytes costs microseconds, and the key never
leaves the leader); each worker process builds the Binding's body, encodes it and sends it over
its own keep-alive TLS connections, from a request loop of its own (kubeio/loop.py). The leader sends each process a
`BindJob` on that process's queue and reads every answer on one thread (`BindProcesses._collect`),
which calls the job's `done` with None (bound) or the error the leader's own client would have
raised, so that the binder's outcome paths are the same as with threads.

Fencing: a job carries the lease's deadline on the machine's monotonic clock, which every process
reads alike; a worker sends nothing past it, checked before the request and again as it is written
(the `guard` of kubeio's client). A worker exits when the leader does (it watches the leader's
process sentinel); a worker that dies is started again and its jobs are failed back as transport
errors, so that each is decided again.

Jobs travel in batches, as answers do: `submit` puts a job in its process's outbox and one thread
(`BindProcesses._send`) writes each outbox as one message, so the leader pays a pickle and a write
a batch, not a queue's lock, wake-up, pickle and write a job.

Backpressure: the leader decides a pod only when the processes have room for its job
(`wait_for_room`: every process has started and opened its connections, and fewer than
`QUEUED_PER_SLOT` jobs a Binding in flight are unanswered). Its deadline is stamped as it is
decided, so it is spent on the Binding, not in a queue behind thousands of others or behind a
process still starting: without it, a backlog larger than what the processes send within the
renew deadline had its later jobs dropped as fenced and decided again.

Contract: `submit` and `wait_for_room` from any thread; `done` runs on the collecting thread (or
on the caller's, when the pool is closed); `close` once, by the owner.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import multiprocessing
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from multiprocessing.context import SpawnProcess

import orjson
from kubernetes import client as k8s_client

from kubeio import bodies
from kubeio.client import ClientSettings, Kube, Response
from kubeio.errors import APIError, APITransportError, FencedError, error_for
from kubeio.loop import RequestLoop, answer_error
from kubeio.paths import PODS
from kubeio.requests import Request, prepare

log = logging.getLogger(__name__)

_CONTEXT = multiprocessing.get_context("spawn")  # the leader runs threads: no fork


@dataclass(frozen=True, slots=True)
class KubeConnection:
    """How to open a client like the leader's, in another process. `reload`: the leader's
    configuration refreshes its token (a service account's token file, a kubeconfig's exec
    plugin): the worker loads the configuration as the leader did, and re-reads it as it does."""

    settings: ClientSettings
    host: str
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    verify: bool = True
    server_name: str | None = None
    token: str | None = None  # the Authorization header's value
    reload: bool = False


def connection_of(kube: Kube) -> KubeConnection:
    config = kube.configuration
    token = config.get_api_key_with_prefix("BearerToken", alias="authorization")
    return KubeConnection(
        settings=kube.settings,
        host=kube.host,
        ca_file=config.ssl_ca_cert or None,
        cert_file=config.cert_file or None,
        key_file=config.key_file or None,
        verify=bool(config.verify_ssl),
        server_name=config.tls_server_name or None,
        token=token or None,
        reload=config.refresh_api_key_hook is not None,
    )


def open_client(connection: KubeConnection, pool: int) -> Kube:
    settings = ClientSettings(
        kubeconfig=connection.settings.kubeconfig,
        context=connection.settings.context,
        qps_pool=pool,
        timeout_seconds=connection.settings.timeout_seconds,
        user_agent=connection.settings.user_agent,
    )
    if connection.reload:
        return Kube.connect(settings)
    config = k8s_client.Configuration()
    config.host = connection.host
    config.ssl_ca_cert = connection.ca_file
    config.cert_file = connection.cert_file
    config.key_file = connection.key_file
    config.verify_ssl = connection.verify
    config.tls_server_name = connection.server_name
    if connection.token:
        config.api_key = {"BearerToken": connection.token}
    return Kube(config, settings)


@dataclass(frozen=True, slots=True)
class BindJob:
    """One pod's Binding, as signed by the leader; `deadline`: the lease's, on time.monotonic."""

    deadline: float
    name: str
    namespace: str
    uid: str
    node: str
    annotations: dict[str, str] = field(default_factory=dict)


#: (job number, status, reason, message): status 201 when bound; 0 when not answered (reason
#: "Fenced": not sent, the deadline passed).
BindResult = tuple[int, int, str, str]
#: What the leader writes to a process: a batch of (job number, job); None: the process ends.
_Jobs = list[tuple[int, BindJob]] | None

BOUND = 201
#: Unanswered jobs a Binding in flight before `wait_for_room` holds the leader's next decision:
#: enough that each process's loop has its next job at hand as an answer comes back, few enough
#: that a job waits for about one Binding's answer before it is sent.
QUEUED_PER_SLOT = 2
_CRASH_LOOP_SECONDS = 1.0
FENCED = "Fenced"


def error_of(result: BindResult) -> APIError | None:
    """The error the leader's own client would have raised for `result`; None when bound."""
    _seq, status, reason, message = result
    if 200 <= status < 300:
        return None
    if status == 0:
        if reason == FENCED:
            return FencedError(0, FENCED, message)
        return APITransportError(0, reason or "Transport", message)
    return error_for(status, orjson.dumps({"reason": reason, "message": message}))


def _guard(job: BindJob) -> Callable[[], bool]:
    def guard() -> bool:
        return time.monotonic() < job.deadline

    return guard


def request_of(job: BindJob) -> Request:
    body = bodies.binding(job.name, job.namespace, job.uid, job.node, job.annotations)
    return prepare("POST", PODS.item(job.name, job.namespace, "binding"), body=body)


def result_of(seq: int, answer: Response | APIError) -> BindResult:
    """A job's result from what the client answered (an error status, an error raised)."""
    error = answer_error(answer)
    if error is None:
        return (seq, BOUND, "Created", "")
    return (seq, error.status, error.reason, error.message)


def send(kube: Kube, seq: int, job: BindJob) -> BindResult:
    """Sends one job's Binding unless its deadline passed, before or as it is written."""
    guard = _guard(job)
    if not guard():
        return (seq, 0, FENCED, "lease deadline passed: not sent")
    try:
        return result_of(seq, kube.send(request_of(job), guard=guard))
    except APIError as exc:
        return result_of(seq, exc)


def _serve(
    connection: KubeConnection, in_flight: int, jobs: Connection, results: Connection
) -> None:
    """A worker process: one thread takes the jobs and sends their Bindings from a request loop
    (kubeio/loop.py), `in_flight` at most at a time; one sends the results back in batches (one
    pipe write for many)."""
    parent = multiprocessing.parent_process()
    if parent is not None:
        # Ends with the leader, however it ended (killed included): no orphan keeps binding.
        threading.Thread(target=_exit_with, args=(parent.sentinel,), daemon=True).start()
    kube = open_client(connection, in_flight)
    loop = RequestLoop(kube, in_flight, name="bind-loop")
    loop.warm(in_flight)
    results.send([])  # ready: an empty batch (the sender thread below writes the rest)
    done: queue.SimpleQueue[BindResult | None] = queue.SimpleQueue()

    def take() -> None:
        while (batch := _take(jobs)) is not None:
            for seq, job in batch:
                guard = _guard(job)
                if not guard():
                    done.put((seq, 0, FENCED, "lease deadline passed: not sent"))
                    continue
                try:
                    loop.submit(request_of(job), _answering(done, seq), guard)
                except Exception as exc:  # a job is always answered, or the leader waits on it
                    log.exception("bind job failed")
                    done.put((seq, 0, "Transport", f"bind worker: {exc}"))
        loop.close()  # what is still in flight is answered, as a transport error
        done.put(None)

    def answer() -> None:
        while True:
            batch: list[BindResult] = []
            item = done.get()
            while True:
                if item is None:
                    if batch:
                        results.send(batch)
                    return
                batch.append(item)
                if done.empty():
                    break
                item = done.get()
            results.send(batch)

    taker = threading.Thread(target=take, daemon=True)
    sender = threading.Thread(target=answer, daemon=True)
    for thread in (taker, sender):
        thread.start()
    sender.join()
    results.close()
    kube.close()


def _answering(
    done: queue.SimpleQueue[BindResult | None], seq: int
) -> Callable[[Response | APIError], None]:
    def answered(answer: Response | APIError) -> None:
        done.put(result_of(seq, answer))

    return answered


def _take(jobs: Connection) -> list[tuple[int, BindJob]] | None:
    """The next batch of jobs; None at the end (or when the leader is gone: its end closed)."""
    try:
        batch: _Jobs = jobs.recv()
    except (EOFError, OSError):
        return None
    return batch


def _write(worker: _Worker, jobs: _Jobs) -> None:
    """Writes a batch (or the end) to a process; one that exited takes nothing, and its jobs are
    failed back when its results reach their end (`BindProcesses._died`)."""
    with contextlib.suppress(OSError, ValueError):
        worker.jobs.send(jobs)


def _exit_with(sentinel: int) -> None:
    wait([sentinel])
    os._exit(1)


@dataclass(slots=True)
class _Worker:
    process: SpawnProcess
    jobs: Connection  # the leader's end: it writes the batches
    results: Connection
    started: float  # time.monotonic()
    ready: bool = False  # started and connected: its first (empty) batch came back


class BindProcesses:
    """`processes` worker processes with `in_flight` Binding calls in flight each."""

    def __init__(self, connection: KubeConnection, processes: int, in_flight: int) -> None:
        if processes < 1 or in_flight < 1:
            raise ValueError("bind processes and their Bindings in flight must be at least 1")
        self._connection = connection
        self._in_flight_each = in_flight
        self._seq = itertools.count()
        self._lock = threading.Lock()
        #: job number -> (worker index, what to call with its outcome)
        self._in_flight: dict[int, tuple[int, Callable[[APIError | None], None]]] = {}
        #: `_in_flight` shrank, or the pool closed (`wait_for_room`)
        self._room = threading.Condition(self._lock)
        self._capacity = processes * in_flight * QUEUED_PER_SLOT
        self._closed = False
        self._wake_reader, self._wake_writer = _CONTEXT.Pipe(duplex=False)
        self._workers = [self._spawn() for _ in range(processes)]
        #: worker index -> the jobs not written to it yet (`_send` takes them all at once)
        self._outboxes: list[list[tuple[int, BindJob]]] = [[] for _ in self._workers]
        #: an outbox was filled since `_send` last took them, or the pool closed
        self._jobs_waiting = threading.Condition(self._lock)
        self._due = False
        self._restarts = 0
        self._sender = threading.Thread(target=self._send, name="bind-jobs", daemon=True)
        self._collector = threading.Thread(target=self._collect, name="bind-results", daemon=True)
        self._sender.start()
        self._collector.start()

    @property
    def restarts(self) -> int:
        return self._restarts

    def pids(self) -> list[int | None]:
        return [worker.process.pid for worker in self._workers]

    def _spawn(self) -> _Worker:
        jobs_reader, jobs = _CONTEXT.Pipe(duplex=False)
        reader, writer = _CONTEXT.Pipe(duplex=False)
        process = _CONTEXT.Process(
            target=_serve,
            args=(self._connection, self._in_flight_each, jobs_reader, writer),
            name="gpuplace-bind",
            daemon=True,  # terminated too when the leader exits normally
        )
        process.start()
        # The worker holds the only reader of its jobs (a write to a dead one fails) and the only
        # writer of its results (EOF when it exits).
        jobs_reader.close()
        writer.close()
        return _Worker(process, jobs, reader, time.monotonic())

    def wait_for_room(self, timeout: float) -> bool:
        """Whether the processes have room for one more job: all of them ready, and fewer jobs
        unanswered than they take (or the pool is closed: `submit` then fails it back), waiting up
        to `timeout` seconds for it."""
        with self._room:
            return self._room.wait_for(self._has_room, timeout)

    def _has_room(self) -> bool:
        """Under `_lock`."""
        if self._closed:
            return True
        return len(self._in_flight) < self._capacity and all(w.ready for w in self._workers)

    def submit(self, job: BindJob, done: Callable[[APIError | None], None]) -> None:
        seq = next(self._seq)
        with self._lock:
            if not self._closed:
                index = seq % len(self._workers)
                self._in_flight[seq] = (index, done)
                self._outboxes[index].append((seq, job))
                if not self._due:
                    self._due = True
                    self._jobs_waiting.notify()
                return
        done(FencedError(0, FENCED, "bind processes stopped: not sent"))

    def _send(self) -> None:
        """The one thread that writes jobs: every outbox as one message to its process; once
        closed, what was queued before and then the end, to each process."""
        while True:
            with self._lock:
                self._jobs_waiting.wait_for(lambda: self._due or self._closed)
                self._due = False
                batches = [
                    (w, box) for w, box in zip(self._workers, self._outboxes, strict=True) if box
                ]
                self._outboxes = [[] for _ in self._workers]
                closing, workers = self._closed, list(self._workers)
            for worker, batch in batches:
                _write(worker, batch)
            if closing:
                for worker in workers:
                    _write(worker, None)
                return

    def _collect(self) -> None:
        """The one thread that reads answers; a worker's pipe at EOF means it exited (it holds
        the pipe's only writer)."""
        while True:
            with self._lock:
                open_ = [(i, w) for i, w in enumerate(self._workers) if not w.results.closed]
                if self._closed and (not self._in_flight or not open_):
                    return
            ready = wait([self._wake_reader, *(w.results for _, w in open_)])
            for index, worker in open_:
                if worker.results in ready:
                    self._read(index, worker)
            if self._wake_reader in ready:
                self._wake_reader.recv()

    def _read(self, index: int, worker: _Worker) -> None:
        try:
            batch: list[BindResult] = worker.results.recv()
        except (EOFError, OSError):
            self._died(index, worker)
            return
        if not batch:
            with self._lock:
                worker.ready = True
                self._room.notify_all()
            return
        for result in batch:
            with self._lock:
                entry = self._in_flight.pop(result[0], None)
                self._room.notify()
            if entry is not None:
                self._call(entry[1], error_of(result))

    def _died(self, index: int, worker: _Worker) -> None:
        """A worker exited: its jobs fail back (sent or not, the pod's next event or decision
        settles it) and, unless closing, another process takes its place."""
        worker.process.join(timeout=1.0)
        worker.results.close()
        if not self._closed and time.monotonic() - worker.started < _CRASH_LOOP_SECONDS:
            # One that cannot even start (an unreadable kubeconfig) is not restarted in a loop.
            time.sleep(_CRASH_LOOP_SECONDS)
        with self._lock:
            lost = [seq for seq, (at, _) in self._in_flight.items() if at == index]
            calls = [self._in_flight.pop(seq)[1] for seq in lost]
            self._outboxes[index] = []  # failed back: never written to the next process
            self._room.notify_all()
            if not self._closed and self._workers[index] is worker:
                log.error(
                    "bind process %s exited (code %s): %d Bindings failed back, restarting it",
                    worker.process.pid,
                    worker.process.exitcode,
                    len(calls),
                )
                self._restarts += 1
                self._workers[index] = self._spawn()
        error: APIError = (
            FencedError(0, FENCED, "bind processes stopped")
            if self._closed
            else APITransportError(0, "Transport", "bind process exited")
        )
        for call in calls:
            self._call(call, error)

    @staticmethod
    def _call(done: Callable[[APIError | None], None], error: APIError | None) -> None:
        try:
            done(error)
        except Exception:
            log.exception("bind outcome failed")

    def close(self, timeout: float = 5.0) -> None:
        """Ends the processes after the jobs already queued (past their deadline these send
        nothing); what is still unanswered after `timeout` is failed back as fenced."""
        with self._lock:
            self._closed = True
            self._room.notify_all()
            self._jobs_waiting.notify()
            workers = list(self._workers)
        ends = time.monotonic() + timeout
        self._sender.join(timeout)  # the jobs queued, then the end, written to each process
        for worker in workers:
            worker.process.join(max(0.0, ends - time.monotonic()))
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join()
        self._wake_writer.send(None)
        self._collector.join(timeout)
        with self._lock:
            calls = [done for _, done in self._in_flight.values()]
            self._in_flight.clear()
        for call in calls:
            self._call(call, FencedError(0, FENCED, "bind processes stopped"))
        for worker in workers:
            worker.jobs.close()
