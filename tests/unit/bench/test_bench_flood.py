"""`bench.flood`'s choice of the server it floods: its arguments, a candidate's command line serving
the flood's static app, the RSS of a server's process tree, and what the table says of each."""

from __future__ import annotations

import importlib
import importlib.util
import os
import subprocess
from pathlib import Path

import pytest

from bench._candidates import READY_DIR_ENV, command
from bench.flood import (
    SERVERS,
    STATIC_APP,
    MiB,
    counted_refusals,
    described,
    parse,
    process_tree,
    rss_mib,
    static_app,
)

CERT, KEY = Path("/tls/tls.crt"), Path("/tls/tls.key")


def test_the_flood_floods_gpuplaces_own_server_by_default() -> None:
    args = parse([])
    assert args.server == "gpuplace"
    assert (args.bodies, args.body_bytes, args.idle, args.hold) == (300, 3 * MiB, 3000, 10.0)
    assert args.port is None
    assert described(args) == "gpuplace (its own server, 1 process)"


def test_the_flood_chooses_gpuplace_or_a_candidate_server() -> None:
    assert SERVERS == ("gpuplace", "granian", "gunicorn")
    for engine in ("granian", "gunicorn"):
        args = parse(["--server", engine, "--bodies", "5"])
        assert (args.server, args.bodies) == (engine, 5)
        assert described(args) == f"{engine} (the same app, 1 worker process)"
    with pytest.raises(SystemExit):
        parse(["--server", "waitress"])


def test_a_candidate_that_is_not_installed_is_refused_before_the_flood(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(SystemExit):
        parse(["--server", "granian"])
    assert "granian is not installed" in capsys.readouterr().err
    assert parse(["--server", "gpuplace"]).server == "gpuplace"


def test_an_external_server_needs_its_ca_and_pid_and_is_named_by_server() -> None:
    with pytest.raises(SystemExit):
        parse(["--port", "8443"])
    args = parse(["--port", "8443", "--ca", "/ca.pem", "--pid", "1", "--server", "gunicorn"])
    assert described(args) == "gunicorn on 127.0.0.1:8443"


def test_a_candidate_serves_the_flood_s_static_app_factory() -> None:
    granian = command("granian", 8443, CERT, KEY, 1, STATIC_APP)
    assert granian[-1] == STATIC_APP
    assert "--factory" in granian
    assert "--workers=1" in granian
    gunicorn = command("gunicorn", 8443, CERT, KEY, 1, STATIC_APP)
    assert gunicorn[-1] == f"{STATIC_APP}()"
    module, name = STATIC_APP.split(":")
    assert getattr(importlib.import_module(module), name) is static_app


def test_the_static_app_notes_its_process_and_admits_against_one_map(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(READY_DIR_ENV, str(tmp_path))
    app = static_app()
    assert (tmp_path / f"ready-{os.getpid()}").exists()
    metrics = app.test_client().get("/metrics").get_data(as_text=True)
    assert "gpuplace_webhook_model_maps 1.0" in metrics


def test_a_candidates_refusals_read_not_applicable_never_a_number() -> None:
    assert counted_refusals("granian", 1, None) == [  # type: ignore[arg-type]
        ("refused", "n/a (a metric of gpuplace's own server)")
    ]


def vmrss_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("VmRSS:", 1)[1].split()[0]) / 1024


def test_the_rss_sums_the_server_process_and_its_children() -> None:
    me = os.getpid()
    with subprocess.Popen(["sleep", "30"]) as child:
        try:
            tree = process_tree(me)
            assert tree[0] == me
            assert child.pid in tree
            assert rss_mib(child.pid) == vmrss_mib(child.pid) > 0
            assert rss_mib(me) >= vmrss_mib(me) + vmrss_mib(child.pid) - 0.5
        finally:
            child.kill()
    assert rss_mib(2**22 + 1) == 0.0  # no such process
