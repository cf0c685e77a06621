"""The pure core of the webhook: an AdmissionReview in, the AdmissionReview answer out."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from placement.model import Model
from webhook.mapcheck import check_configmap
from webhook.pods import admit_pod
from webhook.review import (
    AdmissionRequest,
    MalformedReviewError,
    Verdict,
    parse_review,
    render_response,
)
from webhook.settings import AdmissionSettings


class Endpoint(StrEnum):
    MUTATE = "mutate"
    VALIDATE = "validate"


@dataclass(frozen=True, slots=True)
class _Route:
    group: str
    kind: str
    decide: Callable[[AdmissionRequest, Model, AdmissionSettings], Verdict]


_ROUTES = {
    Endpoint.MUTATE: _Route("", "Pod", admit_pod),
    Endpoint.VALIDATE: _Route(
        "", "ConfigMap", lambda request, model, _settings: check_configmap(request, model.grants)
    ),
}


def decide(
    body: object, model: Model, settings: AdmissionSettings, endpoint: Endpoint = Endpoint.MUTATE
) -> tuple[AdmissionRequest, Verdict]:
    """Parses the review and decides; raises MalformedReviewError for a body that is not one."""
    request = parse_review(body)
    route = _ROUTES[endpoint]
    if (request.group, request.kind) != (route.group, route.kind):
        what = f"{request.group}/{request.kind}" if request.group else request.kind
        raise MalformedReviewError(
            f"/{endpoint.value} admits {route.kind} objects, not {what}; "
            "check the rules of the webhook configuration",
            status=422,
        )
    return request, route.decide(request, model, settings)


def build_response(
    review: object,
    model: Model,
    settings: AdmissionSettings,
    endpoint: Endpoint = Endpoint.MUTATE,
) -> dict[str, Any]:
    """The AdmissionReview answering `review`; raises MalformedReviewError for a body that is not one."""
    request, verdict = decide(review, model, settings, endpoint)
    return render_response(request.uid, verdict)
