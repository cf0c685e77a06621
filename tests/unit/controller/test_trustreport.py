"""TrustReport under its contract: informer threads judge and forget pods concurrently; the gauge
it feeds always ends at the number of pods whose binding is unverifiable."""

from __future__ import annotations

import threading
from typing import Any

from controller.trustreport import Judged, TrustReport
from kubeio.events import EventRecorder, ObjectRef
from placement.keyring import Trust, Verdict
from placement.types import MapKey

MAP = MapKey("ml", "llm")


class Sink:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.writes: list[Any] = []

    def patch(self, path: str, body: Any, **_kw: Any) -> dict[str, Any]:
        with self.lock:
            self.writes.append(body)
        return {}

    def create(self, path: str, body: Any, guard: Any = None) -> Any:
        return body


def judged(i: int, trust: Trust) -> Judged:
    return Judged(ObjectRef("Pod", "ml", f"p-{i}", f"uid-{i}"), MAP, Verdict(trust, "k"))


def test_concurrent_verdicts_leave_the_gauge_at_the_unverifiable_count() -> None:
    sink = Sink()
    gauge: list[int] = []
    maps: list[MapKey] = []
    report = TrustReport(
        sink,  # type: ignore[arg-type]
        EventRecorder(sink, "t"),  # type: ignore[arg-type]
        gauge.append,
        on_map=maps.append,
    )

    def churn(offset: int) -> None:
        for i in range(offset, offset + 200):
            report.judged(judged(i, Trust.UNVERIFIABLE))
            report.judged(judged(i, Trust.UNVERIFIABLE))  # the pod's next event: no new write
            if i % 2:
                report.judged(judged(i, Trust.ADOPTED))
            if i % 4 == 0:
                report.gone(f"uid-{i}")

    threads = [threading.Thread(target=churn, args=(n * 1000,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    report._executor.shutdown(wait=True)
    # Of each 200: 100 adopted, 50 gone, 50 still unverifiable.
    assert report.total() == report.count(MAP) == 4 * 50
    assert len(report.unverifiable()) == 200
    # One True write per pod made unverifiable, one False per adopted pod.
    statuses = [w["status"]["conditions"][0]["status"] for w in sink.writes]
    assert statuses.count("True") == 4 * 200 and statuses.count("False") == 4 * 100
    assert set(maps) == {MAP}


def test_a_condition_already_true_is_not_written_again_by_a_new_leader() -> None:
    sink = Sink()
    report = TrustReport(sink, EventRecorder(sink, "t"))  # type: ignore[arg-type]
    report.judged(judged(1, Trust.UNVERIFIABLE), flagged=True)
    report.judged(judged(2, Trust.VERIFIED), flagged=True)  # its key is back: turned False
    report._executor.shutdown(wait=True)
    assert report.total() == 1
    assert [w["status"]["conditions"][0]["reason"] for w in sink.writes] == ["BindingVerified"]
