"""What the parent of several server processes hands them: the port, and the certificates a
bootstrap issued, which each process serves and reloads like mounted files."""

from __future__ import annotations

import json
import socket
import stat
from datetime import timedelta
from pathlib import Path

from placement.annotations import MAP_LABEL
from tests.unit.webhook_builders import make_model, make_pod, review
from webhook.app import create_app
from webhook.certs import generate_ca, issue_serving
from webhook.modelcache import StaticModel
from webhook.processes import reserve_port, write_pair_files
from webhook.settings import WebhookSettings
from webhook.tls import MountedFilesWatcher, ServingTLS

DAY = timedelta(days=1)


def test_a_reserved_port_can_be_bound_again_with_reuse_port() -> None:
    reserved = reserve_port("127.0.0.1", 0)
    try:
        port = reserved.getsockname()[1]
        assert port != 0
        with socket.socket() as worker:
            worker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            worker.bind(("127.0.0.1", port))
            worker.listen()
            with socket.create_connection(("127.0.0.1", port), timeout=5):
                conn, _ = worker.accept()  # the worker's socket gets the connection
                conn.close()
    finally:
        reserved.close()


def test_issued_pairs_reach_a_process_through_its_file_watcher(tmp_path: Path) -> None:
    ca = generate_ca("test-ca", DAY * 10)
    first = issue_serving(ca, ["localhost"], ["127.0.0.1"], DAY)
    second = issue_serving(ca, ["localhost"], ["127.0.0.1"], DAY * 2)
    cert, key = write_pair_files(tmp_path, first.cert_pem, first.key_pem)
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    served = ServingTLS(first)
    try:
        watcher = MountedFilesWatcher(served, str(cert), str(key), interval=60)
        assert watcher.check() is False
        write_pair_files(tmp_path, second.cert_pem, second.key_pem)
        assert watcher.check() is True
        assert served.pair == second
        assert sorted(p.name for p in tmp_path.iterdir()) == ["tls.crt", "tls.key"]
    finally:
        served.close()


def test_one_process_counts_its_reviews_without_a_pid_label() -> None:
    app = create_app(WebhookSettings(), StaticModel(make_model().map("llm").obj()))
    client = app.test_client()
    for name in ("web-0", "plain"):
        body = json.dumps(review(make_pod(name).label(MAP_LABEL, "llm").obj()))
        assert client.post("/mutate", data=body, content_type="application/json").status_code == 200
    text = client.get("/metrics").get_data(as_text=True)
    assert "\ngpuplace_webhook_process_reviews 2.0\n" in text
