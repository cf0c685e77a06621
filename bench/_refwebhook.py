"""The reference mutating webhook (`bench/refwebhook`, Go): answers every review with one fixed JSON
patch. Registered in place of gpuplace's for a burst, it shows what a webhook costs the apiserver
when the server itself costs next to nothing: the floor under "creates/s through the webhook"."""

from __future__ import annotations

import hashlib
import json
import os
import ssl
import subprocess
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench._proc import BenchError
from gpuplace_dev.localcluster.binaries import cache_root

SOURCE = Path(__file__).with_name("refwebhook")


def binary() -> Path:
    """The built server, cached by the hash of its source; built with the local Go toolchain
    (standard library only: no module is downloaded)."""
    digest = hashlib.sha256()
    for name in ("go.mod", "main.go"):
        digest.update((SOURCE / name).read_bytes())
    path = cache_root() / "bench" / f"refwebhook-{digest.hexdigest()[:16]}"
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=mod", "CGO_ENABLED": "0"}
    partial = path.with_suffix(".partial")
    result = subprocess.run(
        ["go", "build", "-o", str(partial), "."],
        cwd=SOURCE,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise BenchError(f"building the reference webhook failed:\n{result.stderr[-2000:]}")
    partial.rename(path)
    return path


class ReferenceWebhook:
    """The reference server on 127.0.0.1, serving `patch` with the given certificate."""

    def __init__(
        self, workdir: Path, patch: Sequence[dict[str, Any]], cert: Path, key: Path, ca: Path
    ) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        patch_file = workdir / "refwebhook-patch.json"
        patch_file.write_text(json.dumps(list(patch), separators=(",", ":")))
        self._log = (workdir / "refwebhook.log").open("wb")
        self._proc = subprocess.Popen(
            [
                str(binary()),
                f"--tls-cert-file={cert}",
                f"--tls-key-file={key}",
                f"--patch-file={patch_file}",
            ],
            stdout=subprocess.PIPE,
            stderr=self._log,
        )
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline().decode().strip()
        if not line.isdigit():
            self.stop()
            raise BenchError(f"the reference webhook did not start: see {workdir}/refwebhook.log")
        self.port = int(line)
        self.pid = self._proc.pid
        self._context = ssl.create_default_context(cafile=str(ca))

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def reviews(self) -> int:
        """How many reviews it has answered."""
        with urllib.request.urlopen(
            f"{self.url}/reviews", context=self._context, timeout=10
        ) as answer:
            return int(answer.read())

    def stop(self) -> None:
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._proc.stdout is not None:
            self._proc.stdout.close()
        self._log.close()

    def __enter__(self) -> ReferenceWebhook:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()
