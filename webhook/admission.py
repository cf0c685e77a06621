"""The pure core of the webhook: an AdmissionReview in, the AdmissionReview answer out."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from placement.model import Model
from placement.types import API_GROUP, KIND, POLICY_KIND
from webhook.mapcheck import check_configmap, check_policy_resource, check_resource
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
    Endpoint.MUTATE: (_Route("", "Pod", admit_pod),),
    Endpoint.VALIDATE: (
        _Route(
            "",
            "ConfigMap",
            lambda request, model, _settings: check_configmap(request, model.grants),
        ),
        _Route(
            API_GROUP, KIND, lambda request, model, _settings: check_resource(request, model.grants)
        ),
        _Route(
            API_GROUP,
            POLICY_KIND,
            lambda request, _model, _settings: check_policy_resource(request),
        ),
    ),
}


def decide(
    body: object, model: Model, settings: AdmissionSettings, endpoint: Endpoint = Endpoint.MUTATE
) -> tuple[AdmissionRequest, Verdict]:
    """Parses the review and decides; raises MalformedReviewError for a body that is not one."""
    request = parse_review(body)
    routes = _ROUTES[endpoint]
    for route in routes:
        if (request.group, request.kind) == (route.group, route.kind):
            return request, route.decide(request, model, settings)
    what = f"{request.group}/{request.kind}" if request.group else request.kind
    also = " and ".join(f"{r.group}/{r.kind}" for r in routes[1:])
    raise MalformedReviewError(
        f"/{endpoint.value} admits {routes[0].kind} objects, not {what}"
        + (f" (also {also} objects)" if also else "")
        + "; check the rules of the webhook configuration",
        status=422,
    )


def build_response(
    review: object,
    model: Model,
    settings: AdmissionSettings,
    endpoint: Endpoint = Endpoint.MUTATE,
) -> dict[str, Any]:
    """The AdmissionReview answering `review`; raises MalformedReviewError for a body that is not one."""
    request, verdict = decide(review, model, settings, endpoint)
    return render_response(request.uid, verdict)
