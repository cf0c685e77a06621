"""The server's caps hold for the whole server: with `processes` N each process keeps 1/N."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest
from flask import Flask

from kubeio.bounds import Refusal
from kubeio.server import Server
from tests.unit.webhook.test_webhook_bounds import BOUNDED, CONNECTIONS, ca, open_tls, refused, tls
from tests.unit.webhook.test_webhook_server import settings
from tests.unit.webhook_builders import make_model
from webhook.app import create_app
from webhook.certs import KeyPair
from webhook.modelcache import StaticModel
from webhook.server import https_server
from webhook.settings import CONNECTION_SHARE_BYTES, ProcessCaps, ServerSettings
from webhook.tls import ServingTLS

__all__ = ["ca", "tls"]  # fixtures

MiB = 1024 * 1024


def test_one_process_keeps_the_caps_whole() -> None:
    server = ServerSettings()
    assert server.per_process() == ProcessCaps(
        max_connections=server.max_connections,
        max_connections_per_client=server.max_connections // 2,
        max_buffered_bytes=server.max_buffered_bytes,
        validation_threads=server.validation_threads,
        validation_queue_per_namespace=server.validation_queue_per_namespace,
        validation_queue=server.validation_queue,
    )
    assert server.per_process().pool_bytes == 64 * MiB


@pytest.mark.parametrize("processes", [1, 2, 3, 4, 5])
def test_processes_together_stay_within_the_caps(processes: int) -> None:
    server = ServerSettings(processes=processes)
    each = server.per_process()
    assert processes * each.max_connections <= server.max_connections
    assert processes * each.max_connections_per_client <= server.max_connections // 2
    assert processes * each.max_buffered_bytes <= server.max_buffered_bytes
    # Rounded down by less than one a process: the pod keeps (nearly) what it was given.
    assert processes * each.max_connections > server.max_connections - processes
    # Every process can still take one body of the largest size besides its connections' shares.
    assert each.pool_bytes >= server.max_body_bytes - CONNECTION_SHARE_BYTES


def test_each_process_validates_on_one_thread_at_least() -> None:
    each = ServerSettings(processes=4, validation_threads=2).per_process()
    assert each.validation_threads == 1
    assert (each.validation_queue_per_namespace, each.validation_queue) == (1, 8)
    assert ServerSettings(processes=2, validation_threads=6).per_process().validation_threads == 3


def test_bytes_that_leave_a_process_no_room_for_a_body_are_refused() -> None:
    # Enough for one process, not for each of two.
    enough_for_one = 512 * CONNECTION_SHARE_BYTES + 3 * MiB
    ServerSettings(max_buffered_bytes=enough_for_one)
    with pytest.raises(ValueError, match="in each of the 2 processes: give at least") as refused:
        ServerSettings(processes=2, max_buffered_bytes=enough_for_one)
    least = int(str(refused.value).rsplit(" ", 1)[1])
    assert least == 2 * (256 * CONNECTION_SHARE_BYTES + 3 * MiB)
    ServerSettings(processes=2, max_buffered_bytes=least)


def test_fewer_connections_than_processes_are_refused() -> None:
    with pytest.raises(ValueError, match="leave none to some of the 4 processes"):
        ServerSettings(processes=4, max_connections=3, max_buffered_bytes=64 * MiB)


def test_fewer_than_one_process_is_refused() -> None:
    with pytest.raises(ValueError, match="processes must be at least 1, not 0"):
        ServerSettings(processes=0)


@pytest.fixture
def one_of_two(tls: ServingTLS) -> Iterator[tuple[Flask, Server]]:
    """One of two processes sharing `BOUNDED`'s caps."""
    shared = replace(BOUNDED, processes=2)
    app = create_app(replace(settings(), server=shared), StaticModel(make_model().obj()))
    server = https_server(app, tls, shared).start()
    try:
        yield app, server
    finally:
        server.stop()


def test_a_process_of_two_keeps_half_the_connections(
    one_of_two: tuple[Flask, Server], ca: KeyPair
) -> None:
    app, server = one_of_two
    idle = [open_tls(server, ca) for _ in range(CONNECTIONS)]
    try:
        assert server.peak_connections == CONNECTIONS // 2
        assert refused(app, Refusal.EVICTED) >= CONNECTIONS // 2 - 1
    finally:
        for sock in idle:
            sock.close()
