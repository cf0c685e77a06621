"""`create_app(settings, models)`: the Flask app, one blueprint a concern."""

from __future__ import annotations

import json

from flask import Flask, Response
from werkzeug.exceptions import HTTPException

from webhook.blueprints import mutate, ops, validate
from webhook.metrics import WebhookMetrics
from webhook.modelcache import ModelSource
from webhook.settings import WebhookSettings
from webhook.state import EXTENSION, WebhookState


def _http_error(exc: HTTPException) -> Response:
    """Werkzeug's errors (404, 405, 413) as JSON with a reason, like our own 4xx answers."""
    code = exc.code or 500
    body = json.dumps({"code": code, "reason": exc.description or exc.name})
    return Response(body, status=code, mimetype="application/json")


def create_app(
    settings: WebhookSettings, models: ModelSource, metrics_dir: str | None = None
) -> Flask:
    """`metrics_dir`: the directory the server processes share their metrics through, if several."""
    app = Flask("gpuplace-webhook")
    # Werkzeug refuses larger bodies with 413 before we read them.
    app.config["MAX_CONTENT_LENGTH"] = settings.server.max_body_bytes
    app.extensions[EXTENSION] = WebhookState(
        settings, models, WebhookMetrics.create(models, metrics_dir)
    )
    app.register_error_handler(HTTPException, _http_error)
    for module in (mutate, validate, ops):
        app.register_blueprint(module.blueprint)
    return app
