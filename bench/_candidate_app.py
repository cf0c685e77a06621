"""gpuplace's webhook app, made in a process of a candidate server (`bench._candidates`): the
Flask app and the model cache as `gpuplace webhook` makes them (`webhook.serve.serve`), with the
settings of the bench's webhook read from the environment the bench sets.

`create` returns once the model is loaded, and notes it with a file named after its process in
`READY_DIR_ENV`: a server process answers only with the whole model, and the bench knows when
every process has it."""

from __future__ import annotations

import os
from pathlib import Path

from flask import Flask

from bench._candidates import ENFORCEMENT_ENV, KUBECONFIG_ENV, READY_DIR_ENV
from kubeio.client import ClientSettings, Kube
from placement.dra import Enforcement
from webhook.app import create_app
from webhook.modelcache import ModelCache
from webhook.settings import AdmissionSettings, WebhookSettings

#: How long a server process waits for the model before it gives up.
LOAD_TIMEOUT = 120.0


def settings() -> WebhookSettings:
    """The bench's webhook's settings (`gpuplace webhook --enforcement=...` with the defaults)."""
    return WebhookSettings(
        admission=AdmissionSettings(enforcement=Enforcement(os.environ[ENFORCEMENT_ENV])),
        kube=ClientSettings(kubeconfig=os.environ[KUBECONFIG_ENV]),
    )


def create() -> Flask:
    """The app, once its model cache has loaded the model."""
    chosen = settings()
    models = ModelCache(Kube.connect(chosen.kube), chosen.model_namespace).start()
    if not models.wait_loaded(LOAD_TIMEOUT):
        models.stop()
        raise RuntimeError(f"the model did not load within {LOAD_TIMEOUT:.0f} s")
    app = create_app(chosen, models)
    (Path(os.environ[READY_DIR_ENV]) / f"ready-{os.getpid()}").touch()
    return app
