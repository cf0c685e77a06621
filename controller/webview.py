"""A read-only web view, served by every controller replica from its caches: the node x GPU grid,
the maps with their status and revision, and the pods that wait with their reasons.

One page of server-rendered HTML (no script), built from what the informers hold: nothing is read
from the apiserver per request and nothing can be changed from it; no Secret is read. Off unless
`--web-address` is set. On localhost only, it is reached with `kubectl port-forward` (which the
apiserver authorises) and needs nothing else; on any other address (a Service, an Ingress), it
must be started with `--web-authenticate`, which makes it ask for a bearer token and check it as
kube-rbac-proxy does: a TokenReview says who it is, a SubjectAccessReview whether that user may
`get` the `services/proxy` subresource of the view's Service, the permission `kubectl proxy` would
need to reach it through the apiserver.

What a caller can make it do is bounded: the server's connections, heads, time and threads
(the components' one server, `kubeio.server`, with a small port's bounds), the verdicts it remembers (`VERDICTS_MAX`, `UNKNOWN_MAX`) and the
reviews it sends at once (`REVIEWS_IN_FLIGHT`).
"""

from __future__ import annotations

import hashlib
import html
import ipaddress
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry

from controller.holders import holder_of
from kubeio.bounds import small_bounds
from kubeio.client import Kube, Obj
from kubeio.errors import APIError
from kubeio.httpserver import ServerMetrics, answer, small_server
from kubeio.paths import Resource
from kubeio.pod import Pod
from placement.annotations import STATUS_ANNOTATION, source_provenance
from placement.inventory import NodeInventory
from placement.occupancy import CellState, GpuCell, occupancy, summary
from placement.podmeta import map_name_of
from placement.status import MapStatus
from placement.types import NodeName

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIEnvironment

log = logging.getLogger(__name__)

TOKEN_REVIEWS = Resource("authentication.k8s.io", "v1", "tokenreviews", namespaced=False)
ACCESS_REVIEWS = Resource("authorization.k8s.io", "v1", "subjectaccessreviews", namespaced=False)
#: How long a token's verdict is reused (kube-rbac-proxy caches too; a revoked token lasts this).
VERDICT_SECONDS = 60.0
#: Verdicts on tokens the apiserver authenticated, least recently used dropped first.
VERDICTS_MAX = 1024
#: Verdicts on tokens it did not, kept apart: random tokens only ever push out each other.
UNKNOWN_MAX = 256
#: TokenReviews (each followed by its SubjectAccessReview) in flight at once; beyond, 503.
REVIEWS_IN_FLIGHT = 2
#: A page is a few hundred KiB at most; a bearer token in the head can be a few KiB.
WEB_BOUNDS = small_bounds(connections=64, head_bytes=16384)
WEB_THREADS = 4


def loopback_only(host: str) -> bool:
    """Whether a listening host is reachable from this machine (or pod) only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


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
                map_name_of(pod) or "(legacy)",
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


@dataclass(frozen=True)
class Verdict:
    code: int  # 200 allowed; 401, 403, 503 refused
    why: str  # the user when allowed
    #: Refused for want of review capacity (not remembered; counted as `busy`).
    busy: bool = False


class Authorizer:
    """Bearer token -> TokenReview -> SubjectAccessReview, each verdict reused for a minute.

    Called from the web server's pool threads at once; `_lock` guards both verdict tables, and
    `_reviews` bounds the reviews in flight. A token is remembered by its SHA-256 only.
    """

    def __init__(self, kube: Kube, namespace: str, service: str) -> None:
        self.kube = kube
        self.namespace = namespace
        self.service = service
        self._known: OrderedDict[str, tuple[float, Verdict]] = OrderedDict()
        self._unknown: OrderedDict[str, tuple[float, Verdict]] = OrderedDict()
        self._lock = threading.Lock()
        self._reviews = threading.BoundedSemaphore(REVIEWS_IN_FLIGHT)

    def check(self, header: str | None) -> Verdict:
        """Verdict(200, user) when allowed; 401, 403 or 503 with why otherwise."""
        scheme, _, token = (header or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return Verdict(401, "a bearer token is required (Authorization: Bearer <token>)")
        key = hashlib.sha256(token.strip().encode()).hexdigest()
        cached = self._cached(key)
        if cached is not None:
            return cached
        if not self._reviews.acquire(blocking=False):
            return Verdict(503, "too many tokens are being reviewed; try again", busy=True)
        try:
            verdict = self._review(token.strip())
        except APIError as exc:
            log.warning("web view: review failed: %s", exc)
            return Verdict(503, "the apiserver could not review the token; try again")
        finally:
            self._reviews.release()
        self._remember(key, verdict)
        return verdict

    def remembered(self) -> tuple[int, int]:
        """(verdicts on authenticated tokens, on the others) held now."""
        with self._lock:
            return len(self._known), len(self._unknown)

    def _cached(self, key: str) -> Verdict | None:
        now = time.monotonic()
        with self._lock:
            for table in (self._known, self._unknown):
                entry = table.get(key)
                if entry is None:
                    continue
                if now - entry[0] >= VERDICT_SECONDS:
                    del table[key]
                    return None
                table.move_to_end(key)
                return entry[1]
        return None

    def _remember(self, key: str, verdict: Verdict) -> None:
        table, most = (
            (self._unknown, UNKNOWN_MAX) if verdict.code == 401 else (self._known, VERDICTS_MAX)
        )
        with self._lock:
            table[key] = (time.monotonic(), verdict)
            table.move_to_end(key)
            while len(table) > most:
                table.popitem(last=False)

    def _review(self, token: str) -> Verdict:
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
            return Verdict(401, "the token is not valid")
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
            return Verdict(
                403,
                f"{name} may not get services/proxy {self.namespace}/{self.service}, which this "
                "view requires",
            )
        return Verdict(200, name)


class WebServer:
    """GET / (the page) and GET /healthz; anything else is 404, any other method 405.

    Refuses to serve beyond localhost without an authorizer (see `loopback_only`)."""

    def __init__(
        self,
        host: str,
        port: int,
        sources: ViewSources,
        authorizer: Authorizer | None = None,
        metrics: ServerMetrics | None = None,
        threads: int = WEB_THREADS,
    ) -> None:
        if authorizer is None and not loopback_only(host):
            raise ValueError(
                f"the web view would show every namespace's maps and pods to anyone who reaches "
                f"{host}:{port}: listen on localhost only (127.0.0.1, reached with kubectl "
                "port-forward) or check callers with --web-authenticate (chart: "
                "controller.web.authenticate: true)"
            )
        self.sources = sources
        self.authorizer = authorizer
        self.metrics = metrics or ServerMetrics(CollectorRegistry())
        self.server = small_server("web", self.app, host, port, self.metrics, WEB_BOUNDS, threads)

    @property
    def port(self) -> int:
        return self.server.port

    def app(self, environ: WSGIEnvironment, start_response: StartResponse) -> list[bytes]:
        """The WSGI app: called on the server's pool threads at once."""
        if environ["REQUEST_METHOD"] not in ("GET", "HEAD"):
            return _text(start_response, 405, "read-only: GET only\n", ("Allow", "GET, HEAD"))
        path = environ["PATH_INFO"]
        if path == "/healthz":
            return _text(start_response, 200, "ok\n")
        if path != "/":
            return _text(start_response, 404, "not found\n")
        if self.authorizer is not None:
            verdict = self.authorizer.check(environ.get("HTTP_AUTHORIZATION"))
            if verdict.busy:
                self.metrics.refuse("web", "busy")
            if verdict.code != 200:
                extra = (("WWW-Authenticate", 'Bearer realm="gpuplace"'),)
                return _text(
                    start_response,
                    verdict.code,
                    f"{verdict.why}\n",
                    *(extra if verdict.code == 401 else ()),
                )
        try:
            body = page(self.sources)
        except Exception:
            log.exception("web view: the page failed")
            return _text(start_response, 500, "the page failed; see the controller's log\n")
        return answer(start_response, 200, body.encode(), "text/html; charset=utf-8", SAFE_HEADERS)

    def start(self) -> WebServer:
        """Binds and serves; a port in use raises OSError here."""
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop()


SAFE_HEADERS = (
    ("Cache-Control", "no-store"),
    ("X-Content-Type-Options", "nosniff"),
    ("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'"),
)


def _text(
    start_response: StartResponse, code: int, text: str, *headers: tuple[str, str]
) -> list[bytes]:
    return answer(start_response, code, text.encode(), headers=(*SAFE_HEADERS, *headers))
