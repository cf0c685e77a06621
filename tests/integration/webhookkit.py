"""The real webhook server (its event loop over HTTPS, a CA made for the test) in the test's process."""

from __future__ import annotations

import socket
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from datetime import timedelta

from gpuplace_dev.localcluster import LocalCluster
from kubeio.server import Server
from webhook.app import create_app
from webhook.certs import KeyPair, issue_serving
from webhook.modelcache import ModelCache
from webhook.server import https_server
from webhook.settings import AdmissionSettings, ServerSettings, WebhookSettings
from webhook.tls import ServingTLS


@dataclass
class RunningWebhook:
    """Our server in this process: the app, the model cache, TLS from a CA made for the test."""

    cluster: LocalCluster
    ca: KeyPair
    models: ModelCache
    port: int = 0
    server: Server | None = None
    tls: ServingTLS | None = None
    admission: AdmissionSettings = field(default_factory=AdmissionSettings)

    def start(self) -> None:
        settings = WebhookSettings(
            admission=self.admission,
            server=ServerSettings(host="127.0.0.1", port=self.port, shutdown_delay_seconds=0),
        )
        self.tls = ServingTLS(
            issue_serving(self.ca, ["localhost"], ["127.0.0.1"], timedelta(days=1))
        )
        self.server = https_server(create_app(settings, self.models), self.tls, settings.server)
        self.server.start()
        self.port = self.server.port

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None
        if self.tls is not None:
            self.tls.close()
            self.tls = None

    def get(self, path: str) -> tuple[int, str]:
        context = ssl.create_default_context(cadata=self.ca.cert_pem.decode())
        try:
            with urllib.request.urlopen(
                f"https://127.0.0.1:{self.port}{path}", context=context, timeout=10
            ) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()


def free_port() -> int:
    """A fixed port (not 0), so a restarted server binds the same one again."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
