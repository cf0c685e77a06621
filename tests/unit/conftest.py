"""Fixtures shared by the unit tests of kubeio's two HTTP clients (`Kube.send`, `RequestLoop`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kubeio.client import Kube
from tests.unit.kubeio.test_kubeio_client import Server, serve


@pytest.fixture
def keeps() -> Iterator[tuple[Server, Kube]]:
    """A local HTTP server that keeps its connections alive, and a client of it."""
    yield from serve(close_after_each=False)


@pytest.fixture
def closes() -> Iterator[tuple[Server, Kube]]:
    """A local HTTP server that closes each connection after its answer, and a client of it."""
    yield from serve(close_after_each=True)
