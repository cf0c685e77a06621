"""`gpuplace webhook` flags and GPUPLACE_* environment into one settings object."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from gpuplace.cli import build_parser, main
from gpuplace.commands.webhook import settings_from
from webhook.settings import WebhookSettings


def parse(*argv: str) -> WebhookSettings:
    return settings_from(build_parser().parse_args(["webhook", *argv]))


def test_defaults() -> None:
    settings = parse()
    assert settings.admission.scheduler_name == "gpuplace"
    assert settings.admission.legacy_mode is True
    assert settings.admission.legacy_scheduler_names == ("gpu-scheduler",)
    assert settings.server.port == 8443
    assert settings.server.max_body_bytes == 3 * 1024 * 1024
    assert settings.tls.bootstrap is False
    assert settings.registration.configuration_name == "gpuplace"
    assert settings.model_namespace == "gpuplace-system"


def test_flags() -> None:
    settings = parse(
        "--scheduler-name", "placer", "--no-legacy", "--legacy-scheduler-name", "a",
        "--legacy-scheduler-name", "b", "--self-signed", "--port", "9443", "--dns-name", "x.test",
        "--ip-address", "10.0.0.1", "--register", "https://127.0.0.1:9443",
        "--configuration-name", "gp", "--namespace", "ops",
    )  # fmt: skip
    assert settings.admission.scheduler_name == "placer"
    assert settings.admission.legacy_mode is False
    assert settings.admission.legacy_scheduler_names == ("a", "b")
    assert settings.tls.bootstrap is True
    assert settings.tls.namespace == "ops"
    assert settings.tls.ip_addresses == ("10.0.0.1",)
    assert "x.test" in settings.tls.dns_names()
    assert settings.server.port == 9443
    assert settings.registration.register_url == "https://127.0.0.1:9443"
    assert settings.registration.configuration_name == "gp"
    assert settings.model_namespace == "ops"


def test_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUPLACE_SCHEDULER_NAME", "env-placer")
    monkeypatch.setenv("GPUPLACE_LEGACY", "false")
    monkeypatch.setenv("GPUPLACE_LEGACY_SCHEDULER_NAMES", "x, y")
    monkeypatch.setenv("GPUPLACE_BOOTSTRAP_TLS", "true")
    monkeypatch.setenv("GPUPLACE_WEBHOOK_PORT", "10443")
    monkeypatch.setenv("GPUPLACE_TLS_CERT_FILE", "/certs/tls.crt")
    settings = parse("--scheduler-name", "flag-wins")
    assert settings.admission.scheduler_name == "flag-wins"
    assert settings.admission.legacy_mode is False
    assert settings.admission.legacy_scheduler_names == ("x", "y")
    assert settings.tls.bootstrap is True
    assert settings.tls.cert_file == "/certs/tls.crt"
    assert settings.server.port == 10443


def test_a_repeated_flag_replaces_its_environment_list(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUPLACE_LEGACY_SCHEDULER_NAMES", "x, y")
    monkeypatch.setenv("GPUPLACE_IP_ADDRESSES", "10.0.0.9")
    monkeypatch.setenv("GPUPLACE_DNS_NAMES", "env.test")
    settings = parse("--legacy-scheduler-name", "a", "--legacy-scheduler-name", "b")
    assert settings.admission.legacy_scheduler_names == ("a", "b")
    assert settings.tls.ip_addresses == ("10.0.0.9",)
    assert settings.tls.extra_dns_names == ("env.test",)
    settings = parse("--ip-address", "10.0.0.1", "--dns-name", "flag.test")
    assert settings.admission.legacy_scheduler_names == ("x", "y")
    assert settings.tls.ip_addresses == ("10.0.0.1",)
    assert settings.tls.extra_dns_names == ("flag.test",)


@pytest.fixture
def root_logging() -> Iterator[None]:
    """The command configures the root logger; put it back for the tests that follow."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.mark.usefixtures("root_logging")
def test_tls_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["webhook"]) == 2
    assert "serves TLS only: pass --tls-cert-file and --tls-key-file" in capsys.readouterr().err


def test_bound_flags_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    defaults = parse().server
    assert (defaults.max_connections, defaults.validation_threads) == (512, 2)
    assert defaults.per_process().pool_bytes == 64 * 1024 * 1024
    monkeypatch.setenv("GPUPLACE_WEBHOOK_MAX_CONNECTIONS", "100")
    monkeypatch.setenv("GPUPLACE_WEBHOOK_WRITE_TIMEOUT_SECONDS", "2.5")
    server = parse(
        "--max-buffered-bytes=40000000",
        "--validation-threads=3",
        "--validation-queue-per-namespace=2",
        "--validation-queue=9",
        "--head-timeout-seconds=4",
    ).server
    assert server.max_connections == 100
    assert server.max_buffered_bytes == 40_000_000
    assert (server.validation_threads, server.validation_queue_per_namespace) == (3, 2)
    assert server.validation_queue == 9
    assert (server.head_timeout_seconds, server.write_timeout_seconds) == (4.0, 2.5)


@pytest.mark.usefixtures("root_logging")
def test_a_byte_cap_too_small_for_one_body_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["webhook", "--bootstrap-tls", "--max-buffered-bytes=1000000"]) == 2
    assert "leave no room for one body" in capsys.readouterr().err
