"""`POST /validate`: placement-map ConfigMaps (CREATE, UPDATE) must hold a valid PlacementMap."""

from __future__ import annotations

from flask import Blueprint, Response

from webhook.admission import Endpoint
from webhook.handler import answer_review

blueprint = Blueprint("validate", __name__)


@blueprint.post("/validate")
def validate() -> Response:
    return answer_review(Endpoint.VALIDATE)
