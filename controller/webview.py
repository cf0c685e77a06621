"""A read-only web view, served by every controller replica from its caches: the node x GPU grid,
the maps with their status and revision, and the pods that wait with their reasons.

One page of server-rendered HTML (no script), built from what the informers hold: nothing is read
from the apiserver per request and nothing can be changed from it; no Secret is read. Off unless
`--web-address` is set. Reached with `kubectl port-forward` (which the apiserver authorises), it
needs nothing else; exposed (an Ingress, a LoadBalancer), `--web-authenticate` makes it ask for a
bearer token and check it as kube-rbac-proxy does: a TokenReview says who it is, a
SubjectAccessReview whether that user may `get` the `services/proxy` subresource of the view's
Service, the permission `kubectl proxy` would need to reach it through the apiserver.
"""

from __future__ import annotations

import hashlib
import html
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from controller.holders import holder_of
from kubeio.client import Kube, Obj
from kubeio.errors import APIError
from kubeio.paths import Resource
from kubeio.pod import Pod
from placement.annotations import STATUS_ANNOTATION, source_provenance
from placement.inventory import NodeInventory
from placement.occupancy import CellState, GpuCell, occupancy, summary
from placement.status import MapStatus
from placement.types import NodeName

log = logging.getLogger(__name__)

TOKEN_REVIEWS = Resource("authentication.k8s.io", "v1", "tokenreviews", namespaced=False)
ACCESS_REVIEWS = Resource("authorization.k8s.io", "v1", "subjectaccessreviews", namespaced=False)
#: How long a token's verdict is reused (kube-rbac-proxy caches too; a revoked token lasts this).
VERDICT_SECONDS = 60.0


@dataclass(frozen=True)
class ViewSources:
    """Where the page's data comes from: the replica's caches, read at each request."""

    identity: str
    leading: Callable[[], bool]
    inventories: Callable[[], Mapping[NodeName, NodeInventory]]
    pods: Callable[[], list[Pod]]
    maps: Callable[[], list[Obj]]  # the source ConfigMaps ([] when maps come from git)


@dataclass(frozen=True)
class MapRow:
    key: str
    phase: str
    slots: str
    revision: str
    file: str
    message: str


def map_rows(objects: Iterable[Obj]) -> list[MapRow]:
    rows = []
    for obj in objects:
        meta = obj.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        revision, file = source_provenance(annotations)
        text = annotations.get(STATUS_ANNOTATION)
        key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        try:
            status = MapStatus.from_json(text) if text else None
        except (ValueError, KeyError, TypeError):
            status = None  # written by another version, or by hand: shown as no status
        if status is None:
            rows.append(MapRow(key, "Pending", "", revision, file, "no status yet"))
            continue
        s = status.slots
        slots = f"{s.total} total, {s.bound} bound, {s.blocked} blocked, {s.drifted} drifted"
        rows.append(MapRow(key, status.phase.value, slots, revision, file, status.message))
    return sorted(rows, key=lambda r: r.key)


def pending_rows(pods: Iterable[Pod]) -> list[tuple[str, str, str, str]]:
    """(pod, map, reason, message) of every pod that waits to be bound."""
    rows = []
    for pod in pods:
        if pod.bound or pod.finished or pod.deleting:
            continue
        waits = pod.condition("PodScheduled", status="False")
        rows.append(
            (
                pod.key,
                pod.map_name or "(legacy)",
                waits.reason if waits else "",
                waits.message if waits else "not examined by the binder yet",
            )
        )
    return sorted(rows)


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _cell(cell: GpuCell) -> str:
    if cell.holders:
        text = " + ".join(f"{h.map}#{h.index}" for h in cell.holders)
        pods = ", ".join(f"{h.namespace}/{h.pod}" for h in cell.holders)
    else:
        text = "free" if cell.state is CellState.FREE else cell.state.value.upper()
        pods = ""
    marks = (
        ""
        if cell.state in (CellState.HELD, CellState.SHARED) or not cell.holders
        else (f" !{cell.state.value}")
    )
    return (
        f'<td class="cell {_e(cell.state.value)}" data-node="{_e(cell.node)}" '
        f'data-gpu="{_e(cell.index if cell.index is not None else "?")}" '
        f'data-uuid="{_e(cell.uuid)}" data-state="{_e(cell.state.value)}" '
        f'title="{_e(cell.reason)}"><span class="slot">{_e(text + marks)}</span>'
        + (f'<br><span class="pod">{_e(pods)}</span>' if pods else "")
        + "</td>"
    )


def _grid(cells: Sequence[GpuCell]) -> str:
    if not cells:
        return "<p>No GPUs: no node inventory (is the agent running?) and no bound pod.</p>"
    columns = sorted({c.index for c in cells if c.index is not None})
    rows: dict[str, dict[int | None, list[GpuCell]]] = {}
    for cell in cells:
        rows.setdefault(cell.node, {}).setdefault(cell.index, []).append(cell)
    extra = any(c.index is None for c in cells)
    head = "".join(f"<th>GPU{i}</th>" for i in columns) + ("<th>?</th>" if extra else "")
    body = []
    for node in sorted(rows):
        tds = []
        for column in [*columns, *([None] if extra else [])]:
            here = rows[node].get(column, [])
            tds.append("".join(_cell(c) for c in here) if here else '<td class="cell none"></td>')
        body.append(f'<tr data-node="{_e(node)}"><th>{_e(node)}</th>{"".join(tds)}</tr>')
    counts = ", ".join(f"{n} {state}" for state, n in summary(cells).items() if n)
    return (
        f'<table id="grid"><thead><tr><th>node</th>{head}</tr></thead>'
        f'<tbody>{"".join(body)}</tbody></table><p id="summary">{_e(counts)} GPU(s)</p>'
    )


def _table(table_id: str, headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table id="{table_id}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em}
th,td{border:1px solid #ccc;padding:.25em .6em;text-align:left;font-size:90%}
.free{background:#e8f5e9}.held{background:#e3f2fd}.shared{background:#e0f7fa}
.drifted,.renumbered,.unverifiable{background:#fff8e1}.degraded,.missing{background:#ffebee}
.none{background:#fafafa}.pod{color:#555;font-size:85%}
"""


def page(sources: ViewSources, now: float | None = None) -> str:
    """The whole page, from the replica's caches as they are now."""
    pods = sources.pods()
    holders = [h for h in (holder_of(p) for p in pods if not p.finished) if h is not None]
    cells = occupancy(sources.inventories(), holders)
    role = "leader" if sources.leading() else "standby"
    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(now))
    maps = [
        (r.key, r.phase, r.slots, r.revision or "-", r.file or "-", r.message)
        for r in map_rows(sources.maps())
    ]
    return (
        '<!doctype html><html><head><meta charset="utf-8"><title>gpuplace</title>'
        f"<style>{STYLE}</style></head><body>"
        f'<h1>gpuplace</h1><p id="replica">replica {_e(sources.identity)} ({role}), '
        f"read from its caches at {_e(stamp)}; read-only</p>"
        f"<h2>Who holds which GPU</h2>{_grid(cells)}"
        "<h2>Placement maps</h2>"
        + _table("maps", ("map", "phase", "slots", "revision", "file", "message"), maps)
        + "<h2>Pods waiting</h2>"
        + _table("pending", ("pod", "map", "reason", "message"), pending_rows(pods))
        + "</body></html>"
    )


class Authorizer:
    """Bearer token -> TokenReview -> SubjectAccessReview, each verdict reused for a minute."""

    def __init__(self, kube: Kube, namespace: str, service: str) -> None:
        self.kube = kube
        self.namespace = namespace
        self.service = service
        self._verdicts: dict[str, tuple[float, int, str]] = {}
        self._lock = threading.Lock()

    def check(self, header: str | None) -> tuple[int, str]:
        """(200, user) when allowed; (401 | 403 | 503, why) otherwise."""
        scheme, _, token = (header or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return 401, "a bearer token is required (Authorization: Bearer <token>)"
        key = hashlib.sha256(token.strip().encode()).hexdigest()
        with self._lock:
            cached = self._verdicts.get(key)
        if cached is not None and time.monotonic() - cached[0] < VERDICT_SECONDS:
            return cached[1], cached[2]
        try:
            code, why = self._review(token.strip())
        except APIError as exc:
            log.warning("web view: review failed: %s", exc)
            return 503, "the apiserver could not review the token; try again"
        with self._lock:
            self._verdicts[key] = (time.monotonic(), code, why)
        return code, why

    def _review(self, token: str) -> tuple[int, str]:
        review = self.kube.create(
            TOKEN_REVIEWS.collection(),
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenReview",
                "spec": {"token": token},
            },
        )
        status = review.get("status") or {}
        if not status.get("authenticated"):
            return 401, "the token is not valid"
        user = status.get("user") or {}
        name = str(user.get("username", ""))
        access = self.kube.create(
            ACCESS_REVIEWS.collection(),
            {
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SubjectAccessReview",
                "spec": {
                    "user": name,
                    "groups": list(user.get("groups") or []),
                    "uid": str(user.get("uid", "")),
                    "extra": dict(user.get("extra") or {}),
                    "resourceAttributes": {
                        "namespace": self.namespace,
                        "verb": "get",
                        "resource": "services",
                        "subresource": "proxy",
                        "name": self.service,
                    },
                },
            },
        )
        if not (access.get("status") or {}).get("allowed"):
            return 403, (
                f"{name} may not get services/proxy {self.namespace}/{self.service}, which this "
                "view requires"
            )
        return 200, name


class WebServer:
    """GET / (the page) and GET /healthz; anything else is 404, any other method 405."""

    def __init__(
        self,
        host: str,
        port: int,
        sources: ViewSources,
        authorizer: Authorizer | None = None,
    ) -> None:
        outer = self

        class _Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/healthz":
                    self._send(200, "ok\n", "text/plain")
                    return
                if path != "/":
                    self._send(404, "not found\n", "text/plain")
                    return
                if outer.authorizer is not None:
                    code, why = outer.authorizer.check(self.headers.get("Authorization"))
                    if code != 200:
                        self._send(code, f"{why}\n", "text/plain")
                        return
                try:
                    body = page(outer.sources)
                except Exception:
                    log.exception("web view: the page failed")
                    self._send(500, "the page failed; see the controller's log\n", "text/plain")
                    return
                self._send(200, body, "text/html; charset=utf-8")

            def _refuse(self) -> None:
                self._send(405, "read-only: GET only\n", "text/plain")

            do_POST = do_PUT = do_PATCH = do_DELETE = _refuse  # noqa: N815

            def _send(self, code: int, text: str, ctype: str) -> None:
                body = text.encode()
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cache-Control", "no-store")
                self.send_header("X-Content-Type-Options", "nosniff")
                self.send_header(
                    "Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'"
                )
                if code == 401:
                    self.send_header("WWW-Authenticate", 'Bearer realm="gpuplace"')
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                return

        self.sources = sources
        self.authorizer = authorizer
        self._server = ThreadingHTTPServer((host, port), _Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="web", daemon=True)

    def start(self) -> WebServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
