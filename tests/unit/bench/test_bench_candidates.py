"""The candidate servers of gpuplace's webhook app: their command lines, what the app factory is
told, and their rows in the creates table (a candidate that did not run reads "not run")."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from bench import NOT_RUN, table
from bench._candidates import (
    APP,
    ENFORCEMENT_ENV,
    ENGINES,
    KUBECONFIG_ENV,
    READY_DIR_ENV,
    ROOT,
    THREADS,
    CandidateError,
    CandidateServer,
    command,
    environment,
    missing,
)
from bench._report import candidate_rows, creates_measurements
from bench._runs import CANDIDATE_CPU, Admission, Results, RunResult
from bench._workload import TARGET_STEADY_RATE, Scale

CERT, KEY = Path("/tls/tls.crt"), Path("/tls/tls.key")


def test_granian_serves_the_app_factory_over_wsgi_and_tls_on_loopback() -> None:
    argv = command("granian", 8443, CERT, KEY, 2)
    assert argv[1:3] == ["-m", "granian"]
    for flag in (
        "--interface=wsgi",
        "--factory",
        "--http=1",
        "--host=127.0.0.1",
        "--port=8443",
        "--workers=2",
        f"--blocking-threads={THREADS}",
        f"--ssl-certificate={CERT}",
        f"--ssl-keyfile={KEY}",
    ):
        assert flag in argv
    assert argv[-1] == APP


def test_gunicorn_serves_the_app_factory_from_gthread_workers_over_tls() -> None:
    argv = command("gunicorn", 8443, CERT, KEY, 2)
    assert argv[1:3] == ["-m", "gunicorn"]
    for flag in (
        "--bind=127.0.0.1:8443",
        "--workers=2",
        "--worker-class=gthread",
        f"--threads={THREADS}",
        "--keep-alive=120",  # longer than the apiserver keeps an idle connection
        f"--certfile={CERT}",
        f"--keyfile={KEY}",
    ):
        assert flag in argv
    assert argv[-1] == f"{APP}()"  # gunicorn calls the factory


def test_an_engine_that_is_not_installed_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    assert missing("waitress") is not None
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert missing("granian") == "granian is not installed (the dev extra has it)"
    with pytest.raises(CandidateError, match="not installed"):
        CandidateServer("granian", Path("/nonexistent"), (CERT, KEY, CERT), {})


def test_the_app_factory_is_told_the_bench_webhooks_settings_and_finds_this_checkout() -> None:
    env = environment(Path("/c/kubeconfig"), "dra", Path("/w/ready"))
    assert env[KUBECONFIG_ENV] == "/c/kubeconfig"
    assert env[ENFORCEMENT_ENV] == "dra"
    assert env[READY_DIR_ENV] == "/w/ready"
    assert env["PYTHONPATH"].split(":")[0] == str(ROOT)


def burst(creates: float, cpu: float = 0.15) -> RunResult:
    return RunResult(1.0, 1.0, pods=300, extra={"creates_per_s": creates, CANDIDATE_CPU: cpu})


def steady(webhook_ms: float, etcd_ms: float) -> Admission:
    calls = tuple([webhook_ms / 1000] * 100)
    return Admission({}, {}, traced=calls, creates=100, etcd=tuple([etcd_ms / 1000] * 100))


def test_a_candidates_rows_set_it_beside_gpuplaces_own_server() -> None:
    rate = TARGET_STEADY_RATE
    results = Results(
        gpuplace_burst=[burst(400)],
        admission_steady={rate: [steady(4.0, 2.0)]},
        candidate_burst={"granian": [burst(500)]},
        candidate_steady={"granian": [steady(3.0, 2.0)]},
    )
    by = {m.metric: m for m in candidate_rows("b", results)}
    served = "gpuplace's webhook served by granian"
    assert by[f"burst creates/s through {served}"].value == 500
    assert by[f"creates/s through {served} / through its own server"].value == 1.25
    assert by["burst: granian CPU per create (its processes)"].value == 0.5  # 0.15 s / 300
    when = f"at {rate} creates/s through {served}"
    assert by[f"webhook p99 (apiserver's traces) {when}"].value == 3.0
    over_etcd = f"webhook p99 / the same creates' etcd write p99 (apiserver's traces) {when}"
    assert by[over_etcd].value == 1.5
    ours = f"webhook p99 at {rate} creates/s (apiserver's traces), served by granian / by its own server"
    assert by[ours].value == 0.75


def test_a_candidate_that_did_not_run_has_its_rows_reading_not_run() -> None:
    rows = creates_measurements(Scale(nodes=50, pods=300), Results())
    candidates = candidate_rows("b", Results())
    assert len(candidates) == 6 * len(ENGINES)
    assert [m.metric for m in rows[-len(candidates) :]] == [m.metric for m in candidates]
    gunicorn = [line for line in table(rows).splitlines() if "gunicorn" in line]
    assert len(gunicorn) == 6
    assert all(f"| {NOT_RUN} |" in line for line in gunicorn)
