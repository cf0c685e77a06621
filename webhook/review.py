"""AdmissionReview v1: the envelope read from the apiserver and the one sent back.

Everything here is pure. A request that is not a well-formed AdmissionReview raises
`MalformedReviewError`, which the HTTP layer answers with a 4xx; a well-formed review about an object we
refuse gets a `Verdict` with `allowed: false`, which the apiserver shows to the user.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import orjson

from placement.errors import MAX_MESSAGE, cap
from webhook.jsonpatch import Operation

#: A denial lists up to placement.errors.MAX_DIAGNOSTICS located problems; past this it is cut.
MAX_DENIAL = 16384

API_VERSION = "admission.k8s.io/v1"
KIND = "AdmissionReview"
OPERATIONS = frozenset({"CREATE", "UPDATE", "DELETE", "CONNECT"})
#: The apiserver uses 36-character UUIDs; anything far longer is not from an apiserver.
MAX_UID_LENGTH = 128


class MalformedReviewError(ValueError):
    """The request body is not an AdmissionReview we can answer; `status` is the HTTP status."""

    def __init__(self, reason: str, status: int = 400) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status


class Result(StrEnum):
    """How a review ended, for the decisions metric."""

    ALLOWED = "allowed"  # admitted unchanged
    PATCHED = "patched"  # admitted with a patch
    DENIED = "denied"
    MALFORMED = "malformed"  # not answered: the request was not an AdmissionReview


@dataclass(frozen=True, slots=True)
class AdmissionRequest:
    uid: str
    kind: str  # e.g. "Pod"
    group: str
    resource: str  # e.g. "pods"
    sub_resource: str
    operation: str
    namespace: str
    name: str
    object: Mapping[str, Any] | None
    old_object: Mapping[str, Any] | None
    dry_run: bool


@dataclass(frozen=True, slots=True)
class Verdict:
    allowed: bool
    patch: tuple[Operation, ...] = ()
    warnings: tuple[str, ...] = ()
    code: int = 200
    reason: str = ""
    message: str = ""
    #: A denial the client may send again after this many seconds: the apiserver answers it
    #: with `Retry-After`, which client-go (kubectl, ArgoCD, controllers) waits and retries on.
    retry_after_seconds: int = 0

    @property
    def result(self) -> Result:
        if not self.allowed:
            return Result.DENIED
        return Result.PATCHED if self.patch else Result.ALLOWED

    @classmethod
    def deny(
        cls,
        message: str,
        *,
        code: int = 403,
        reason: str = "Forbidden",
        warnings: Sequence[str] = (),
        retry_after_seconds: int = 0,
    ) -> Verdict:
        # The message goes back through the apiserver to kubectl or ArgoCD, and into logs.
        return cls(
            False,
            code=code,
            reason=reason,
            message=cap(message, MAX_DENIAL),
            warnings=tuple(cap(w, MAX_MESSAGE) for w in warnings),
            retry_after_seconds=retry_after_seconds,
        )


def _field(data: Mapping[str, Any], key: str, kind: type, where: str, required: bool = True) -> Any:
    value = data.get(key)
    if value is None:
        if required:
            raise MalformedReviewError(f"{where}.{key} is missing")
        return None
    if not isinstance(value, kind):
        raise MalformedReviewError(f"{where}.{key} must be {_KIND_NAMES.get(kind, kind.__name__)}")
    return value


def _shown(value: object) -> str:
    """A value from the request, quoted and cut short for a message."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


_KIND_NAMES: dict[type, str] = {str: "a string", dict: "an object", bool: "a boolean"}


def parse_review(body: object) -> AdmissionRequest:
    """The request inside an AdmissionReview v1; raises MalformedReviewError naming what is wrong."""
    if not isinstance(body, dict):
        raise MalformedReviewError("the body must be a JSON object (an AdmissionReview)")
    api_version = body.get("apiVersion")
    if api_version != API_VERSION:
        raise MalformedReviewError(
            f"apiVersion must be {API_VERSION!r}, got {_shown(api_version)}; "
            "set admissionReviewVersions: [v1] in the webhook configuration"
        )
    if body.get("kind") != KIND:
        raise MalformedReviewError(f"kind must be {KIND!r}, got {_shown(body.get('kind'))}")
    request = _field(body, "request", dict, "AdmissionReview")
    uid = _field(request, "uid", str, "request")
    if not uid or len(uid) > MAX_UID_LENGTH:
        raise MalformedReviewError(f"request.uid must be 1 to {MAX_UID_LENGTH} characters")
    kind = _field(request, "kind", dict, "request")
    resource = _field(request, "resource", dict, "request")
    operation = _field(request, "operation", str, "request")
    if operation not in OPERATIONS:
        raise MalformedReviewError(
            f"request.operation must be one of {', '.join(sorted(OPERATIONS))}, "
            f"got {_shown(operation)}"
        )
    obj = _field(request, "object", dict, "request", required=operation in ("CREATE", "UPDATE"))
    old = _field(request, "oldObject", dict, "request", required=False)
    return AdmissionRequest(
        uid=uid,
        kind=_field(kind, "kind", str, "request.kind"),
        group=_field(kind, "group", str, "request.kind", required=False) or "",
        resource=_field(resource, "resource", str, "request.resource"),
        sub_resource=_field(request, "subResource", str, "request", required=False) or "",
        operation=operation,
        namespace=_field(request, "namespace", str, "request", required=False) or "",
        name=_field(request, "name", str, "request", required=False) or "",
        object=obj,
        old_object=old,
        dry_run=bool(_field(request, "dryRun", bool, "request", required=False)),
    )


def render_response(uid: str, verdict: Verdict) -> dict[str, Any]:
    """The AdmissionReview answering request `uid`."""
    response: dict[str, Any] = {"uid": uid, "allowed": verdict.allowed}
    if verdict.allowed and verdict.patch:
        response["patchType"] = "JSONPatch"
        patch = orjson.dumps(list(verdict.patch))  # compact, as the apiserver reads it
        response["patch"] = base64.b64encode(patch).decode()
    if not verdict.allowed:
        response["status"] = {
            "status": "Failure",
            "code": verdict.code,
            "reason": verdict.reason,
            "message": verdict.message,
        }
        if verdict.retry_after_seconds > 0:
            response["status"]["details"] = {"retryAfterSeconds": verdict.retry_after_seconds}
    if verdict.warnings:
        response["warnings"] = list(verdict.warnings)
    return {"apiVersion": API_VERSION, "kind": KIND, "response": response}


def peek(body: bytes) -> tuple[str, str] | None:
    """The uid and namespace of an AdmissionReview's request, or None if it has no uid; read
    before the review is queued, to queue it under its namespace (a cluster-scoped or unreadable
    one under "")."""
    try:
        review = orjson.loads(body)
    except (ValueError, RecursionError):
        return None
    request = review.get("request") if isinstance(review, dict) else None
    if not isinstance(request, dict):
        return None
    uid, namespace = request.get("uid"), request.get("namespace")
    if not isinstance(uid, str) or not uid or len(uid) > MAX_UID_LENGTH:
        return None
    return uid, namespace if isinstance(namespace, str) else ""
