"""The HTTP shell around `webhook.admission`: read the body, decide, answer, measure."""

from __future__ import annotations

import json
import logging
import time

import orjson
from flask import Response, request

from webhook.admission import Endpoint, decide
from webhook.review import MalformedReviewError, Result, render_response
from webhook.state import state

log = logging.getLogger(__name__)


def problem(status: int, reason: str) -> Response:
    """A 4xx answer whose body says what was wrong with the request."""
    body = json.dumps({"code": status, "reason": reason})
    return Response(body, status=status, mimetype="application/json")


def answer_review(endpoint: Endpoint) -> Response:
    shared = state()
    started = time.perf_counter()
    result = Result.MALFORMED
    try:
        if not request.is_json:
            raise MalformedReviewError("Content-Type must be application/json", status=415)
        body = request.get_data(cache=False)  # over MAX_CONTENT_LENGTH: 413 from werkzeug
        try:
            review = orjson.loads(body)  # a pod's review decodes in a third of json's time
        except (ValueError, RecursionError) as exc:
            raise MalformedReviewError(f"the body is not valid JSON: {exc}"[:300]) from None
        admission, verdict = decide(
            review, shared.models.current(), shared.settings.admission, endpoint
        )
        result = verdict.result
        if not verdict.allowed:
            log.info(
                "denied %s: %s",
                admission.kind,
                verdict.message,
                extra={"uid": admission.uid, "dryRun": admission.dry_run},
            )
        payload = orjson.dumps(render_response(admission.uid, verdict))
        return Response(payload, status=200, mimetype="application/json")
    except MalformedReviewError as exc:
        log.warning("malformed AdmissionReview on /%s: %s", endpoint.value, exc.reason)
        return problem(exc.status, exc.reason)
    finally:
        elapsed = time.perf_counter() - started
        shared.metrics.admission_duration.labels(endpoint.value).observe(elapsed)
        shared.metrics.decisions.labels(endpoint.value, result.value).inc()
        shared.metrics.process_reviews.inc()
