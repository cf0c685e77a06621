"""Structured logging: plain text for people, one JSON object a line for machines."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

#: One log line stays readable and cheap whatever a message quotes (a user's bad input, say).
MAX_MESSAGE = 4096
MAX_TRACEBACK = 16384
_RESERVED = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        data = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": cap(record.getMessage(), MAX_MESSAGE),
        }
        data.update(
            {k: cap(str(v), MAX_MESSAGE) for k, v in vars(record).items() if k not in _RESERVED}
        )
        if record.exc_info:
            data["exc"] = cap(self.formatException(record.exc_info), MAX_TRACEBACK)
        return json.dumps(data, default=str)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging's name)
        record.message = cap(record.message, MAX_MESSAGE)
        return super().formatMessage(record)

    def formatException(self, ei: Any) -> str:  # noqa: N802 (logging's name)
        return cap(super().formatException(ei), MAX_TRACEBACK)


def cap(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters)"


def configure(level: str = "info", json_format: bool = False) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if json_format:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("urllib3").setLevel(logging.WARNING)
