"""`POST /mutate`: pods (CREATE) that opted in get schedulerName and the GPU env wiring."""

from __future__ import annotations

from flask import Blueprint, Response

from webhook.admission import Endpoint
from webhook.handler import answer_review

blueprint = Blueprint("mutate", __name__)


@blueprint.post("/mutate")
def mutate() -> Response:
    return answer_review(Endpoint.MUTATE)
