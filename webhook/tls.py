"""The serving certificate, swapped without a restart.

The server wraps each new connection with `ServingTLS.context`; replacing that attribute with a
freshly loaded context changes the certificate for new handshakes while open connections keep
theirs.
"""

from __future__ import annotations

import logging
import os
import shutil
import ssl
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from webhook.certs import KeyPair

log = logging.getLogger(__name__)


class CertificateError(Exception):
    """A certificate or key that cannot be served (unreadable, not PEM, not a matching pair)."""


def read_pair(cert_file: str, key_file: str) -> KeyPair:
    try:
        return KeyPair(Path(cert_file).read_bytes(), Path(key_file).read_bytes())
    except OSError as exc:
        raise CertificateError(f"cannot read TLS files {cert_file}, {key_file}: {exc}") from exc


class ServingTLS:
    """Owns the TLS context the server wraps new connections with and a private directory for
    the PEM files (`ssl` loads keys only from paths). `context` is replaced, never changed: a
    reader takes it once per connection, without the lock."""

    def __init__(self, pair: KeyPair, on_change: Callable[[KeyPair], None] | None = None) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="gpuplace-webhook-tls-"))
        self._lock = threading.Lock()
        self._serial = 0
        self._on_change = on_change
        try:
            cert, key = self._write(pair)
            self.context = self._context(cert, key)
        except CertificateError:
            self.close()
            raise
        self.pair = pair
        if on_change:
            on_change(pair)

    def _write(self, pair: KeyPair) -> tuple[Path, Path]:
        self._serial += 1
        cert = self._dir / f"tls-{self._serial}.crt"
        key = self._dir / f"tls-{self._serial}.key"
        cert.write_bytes(pair.cert_pem)
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(pair.key_pem)
        return cert, key

    @staticmethod
    def _context(cert: Path, key: Path) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            context.load_cert_chain(str(cert), str(key))
        except (ssl.SSLError, OSError) as exc:
            raise CertificateError(f"certificate and key do not load as a pair: {exc}") from exc
        finally:
            key.unlink(missing_ok=True)  # loaded into memory; no reason to leave it on disk
        return context

    def update(self, pair: KeyPair) -> bool:
        """Serves `pair` from the next handshake on; False if it is what is served already."""
        with self._lock:
            if pair == self.pair:
                return False
            cert, key = self._write(pair)
            context = self._context(cert, key)
            self.context = context
            self.pair = pair
        log.info("serving certificate replaced; expires %s", pair.not_after.isoformat())
        if self._on_change:
            self._on_change(pair)
        return True

    def close(self) -> None:
        shutil.rmtree(self._dir, ignore_errors=True)


class MountedFilesWatcher:
    """Re-reads mounted files (cert-manager renews them in place) and serves them when they change.

    Reading two small files every few seconds is cheaper and more reliable than inotify on the
    kubelet's symlink swaps.
    """

    def __init__(self, tls: ServingTLS, cert_file: str, key_file: str, interval: float) -> None:
        self._tls = tls
        self._cert_file = cert_file
        self._key_file = key_file
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tls-files", daemon=True)

    def start(self) -> MountedFilesWatcher:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def check(self) -> bool:
        """Serves the files if they changed; True if the served certificate changed."""
        try:
            return self._tls.update(read_pair(self._cert_file, self._key_file))
        except CertificateError as exc:
            # Mid-rotation the pair may not match yet; keep serving the old one.
            log.warning("keeping the current certificate: %s", exc)
            return False

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.check()
