"""The controller's read-only web view in a real browser: headless Chromium (Debian's package,
installed by `make test`; a missing browser fails here) loads the page a real controller serves
from its caches on a real cluster; the test reads the DOM for the expected cells and keeps a
screenshot under out/artifacts/."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

import pytest

from gpuplace_dev.localcluster import LocalCluster
from tests.integration.controllerkit import (
    ControllerProcess,
    gpu_uuid,
    occupied_gpus,
    wait_for,
)

ARTIFACTS = Path(__file__).resolve().parents[2] / "out" / "artifacts"


def browser() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    raise AssertionError("no Chromium found: make test installs Debian's chromium")


def headless(url: str, *mode: str) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run(
            [
                browser(),
                "--headless",
                "--no-sandbox",  # as root, in a container
                "--disable-gpu",
                "--disable-dev-shm-usage",
                f"--user-data-dir={profile}",
                "--window-size=1400,900",
                *mode,
                url,
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )


class Cells(HTMLParser):
    """The grid's cells (data-* attributes and text) and the rows of the other tables."""

    def __init__(self) -> None:
        super().__init__()
        self.cells: list[dict[str, str]] = []
        self.tables: dict[str, list[list[str]]] = {}
        self._table = ""
        self._cell: dict[str, str] | None = None
        self._row: list[str] | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "table":
            self._table = a.get("id", "")
            self.tables[self._table] = []
        elif tag == "tr":
            self._row = []
        elif tag == "td":
            self._text = []
            self._cell = a if "data-state" in a else None

    def handle_endtag(self, tag: str) -> None:
        if tag == "td":
            text = "".join(self._text).strip()
            if self._cell is not None:
                self.cells.append({**self._cell, "text": text})
            if self._row is not None:
                self._row.append(text)
        elif tag == "tr" and self._row is not None:
            if self._row:
                self.tables[self._table].append(self._row)
            self._row = None

    def handle_data(self, data: str) -> None:
        self._text.append(data)


@pytest.fixture
def view(cluster: LocalCluster) -> Iterator[tuple[str, list[str], ControllerProcess, int]]:
    with occupied_gpus(cluster, "web", "--web-address") as placed:
        yield placed


@pytest.mark.slow
def test_a_browser_shows_every_gpu_its_holder_the_maps_and_the_waiting_pod(
    view: tuple[str, list[str], ControllerProcess, int],
) -> None:
    namespace, nodes, _controller, port = view
    url = f"http://127.0.0.1:{port}/"

    def rendered() -> Cells | None:
        dom = headless(url, "--dump-dom")
        assert dom.returncode == 0, dom.stderr[-2000:]
        parsed = Cells()
        parsed.feed(dom.stdout)
        waiting = [r for r in parsed.tables.get("pending", []) if r[0] == f"{namespace}/web-2"]
        status = [r for r in parsed.tables.get("maps", []) if r[0] == f"{namespace}/llm"]
        # Once the leader has written web-2's reason and the map's status.
        return parsed if waiting and waiting[0][2] and status and status[0][2] else None

    page = wait_for("the page with web-2's reason and the map's status", rendered, timeout=90)
    ours = [c for c in page.cells if c["data-node"] in nodes]
    assert sorted((c["data-node"], c["data-gpu"]) for c in ours) == [
        (n, str(i)) for n in sorted(nodes) for i in range(4)
    ]
    by_gpu = {(c["data-node"], c["data-gpu"]): c for c in ours}
    assert by_gpu[(nodes[0], "0")]["text"] == f"llm#0{namespace}/web-0"  # map#index, then pod
    assert by_gpu[(nodes[0], "0")]["data-uuid"] == gpu_uuid(nodes[0], 0)
    assert by_gpu[(nodes[0], "2")]["text"] == f"llm#1{namespace}/web-1"
    assert by_gpu[(nodes[0], "3")]["data-state"] == "free"
    assert by_gpu[(nodes[1], "3")]["data-state"] == "degraded"
    assert by_gpu[(nodes[1], "3")]["title"] == "XID 79"
    maps = {r[0]: r for r in page.tables["maps"]}
    assert maps[f"{namespace}/llm"][1] in ("Valid", "Degraded")
    [waiting] = [r for r in page.tables["pending"] if r[0] == f"{namespace}/web-2"]
    assert waiting[1] == "llm" and waiting[2] == "DeviceUnhealthy"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "webview.png"
    shot.unlink(missing_ok=True)
    taken = headless(url, f"--screenshot={shot}")
    assert taken.returncode == 0, taken.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
