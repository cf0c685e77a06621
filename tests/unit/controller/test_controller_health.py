"""Honest operations: every exported metric has a value from the start, and an informer that
keeps failing to list or watch reports itself unhealthy."""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import generate_latest

from controller.metrics import ControllerMetrics
from kubeio.errors import APIServerError
from kubeio.informer import Informer


def test_every_metric_family_has_a_sample_before_any_event() -> None:
    text = generate_latest(ControllerMetrics().registry).decode()
    families = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")]
    assert "gpuplace_slots" in families and "gpuplace_drifted_pods" in families
    samples = [line for line in text.splitlines() if line and not line.startswith("#")]
    for family in families:
        assert any(s.startswith(family) for s in samples), f"{family} has no sample"
    assert 'gpuplace_slots{state="drifted"} 0.0' in samples


class _FailingKube:
    """A client whose every request fails as an unreachable apiserver's would."""

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        raise APIServerError(503, "ServiceUnavailable", f"{method} {path}")

    def stream(self, path: str, query: Any, timeout: float, shape: Any = None) -> Any:
        raise APIServerError(503, "ServiceUnavailable", f"WATCH {path}")


def test_an_informer_failing_longer_than_the_grace_is_unhealthy() -> None:
    informer = Informer(_FailingKube(), "/api/v1/nodes", name="nodes")  # type: ignore[arg-type]
    assert informer.healthy(1.0) is False  # not started: not running
    informer.start()
    try:
        deadline = time.monotonic() + 10
        while informer.failing_since is None:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert informer.healthy(60.0)  # failing, but within the grace
        time.sleep(0.3)
        assert not informer.healthy(0.2)
    finally:
        informer.stop()
