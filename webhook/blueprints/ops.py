"""`/healthz`, `/readyz` and `/metrics`, served on the webhook's own TLS port."""

from __future__ import annotations

from flask import Blueprint, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from webhook.state import state

blueprint = Blueprint("ops", __name__)


def _text(status: int, body: str) -> Response:
    return Response(body + "\n", status=status, mimetype="text/plain")


@blueprint.get("/healthz")
def healthz() -> Response:
    return _text(200, "ok")


@blueprint.get("/readyz")
def readyz() -> Response:
    shared = state()
    if shared.draining.is_set():
        return _text(503, "shutting down")
    if not shared.models.loaded():
        return _text(503, "model not loaded yet")
    return _text(200, "ok")


@blueprint.get("/metrics")
def metrics() -> Response:
    return Response(generate_latest(state().metrics.registry), mimetype=CONTENT_TYPE_LATEST)
