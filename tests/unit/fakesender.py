"""A `Sender` (kubeio/loop.py) that carries each request out at once against a fake apiserver
at gpuplace's own boundary (`create` and `patch`, as the binder's tests' fakes have them)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from kubeio.client import Response
from kubeio.errors import APIError, FencedError
from kubeio.loop import Done
from kubeio.requests import Request


class InlineSender:
    """Answers each request on the submitting thread; refuses everything once drained."""

    def __init__(self, api: Any) -> None:
        self.api = api
        self.drained = False
        self.closed = False

    def submit(self, request: Request, done: Done, guard: Callable[[], bool] | None = None) -> None:
        if self.drained or self.closed:
            done(FencedError(0, "Fenced", f"{request.describe()}: not sent, drained"))
            return
        if guard is not None and not guard():
            done(FencedError(0, "Fenced", f"{request.describe()}: not sent, guard failed"))
            return
        body = orjson.loads(request.body) if request.body else None
        try:
            if request.method == "POST":
                out = self.api.create(request.path, body)
            elif request.method == "PATCH":
                out = self.api.patch(request.path, body, request.content_type or "")
            else:
                raise AssertionError(f"{request.describe()}: not a write the binder sends")
        except APIError as exc:
            done(exc)
            return
        done(Response(201, orjson.dumps(out)))

    def warm(self, count: int) -> None:
        pass

    def drain(self, timeout: float) -> bool:
        self.drained = True
        return True

    def close(self) -> None:
        self.closed = True

    def alive(self) -> bool:
        return not self.closed
