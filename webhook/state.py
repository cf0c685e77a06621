"""What the blueprints of one app share, kept in `app.extensions` (one per app, no globals)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import cast

from flask import Flask, current_app

from webhook.metrics import WebhookMetrics
from webhook.modelcache import ModelSource
from webhook.settings import WebhookSettings

EXTENSION = "gpuplace"


@dataclass(frozen=True, slots=True)
class WebhookState:
    settings: WebhookSettings
    models: ModelSource
    metrics: WebhookMetrics
    #: Set on SIGTERM: /readyz fails so endpoints drop this replica while requests still work.
    draining: threading.Event = field(default_factory=threading.Event)


def state_of(app: Flask) -> WebhookState:
    return cast(WebhookState, app.extensions[EXTENSION])


def state() -> WebhookState:
    return state_of(current_app)
