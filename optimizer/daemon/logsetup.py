"""Daemon logging: text or one JSON object per line, secrets redacted, chatty libraries quiet."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any, TextIO

# Attributes every LogRecord has; anything else was passed with `extra=` and is kept.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}

# httpx logs each request's full URL at INFO, and a Slack webhook's URL is its credential.
_QUIET = {
    "httpx": logging.WARNING,
    "httpcore": logging.WARNING,
    "apscheduler": logging.WARNING,
    "uvicorn.access": logging.WARNING,
}


class JsonFormatter(logging.Formatter):
    """{"ts", "level", "logger", "msg", ...extra fields, "exc"} per line."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                plain = isinstance(value, str | int | float | bool | None)
                out[key] = value if plain else str(value)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


class RedactFilter(logging.Filter):
    """Replace known secret values in the final message and in the fields passed with
    `extra=` (a last line of defence)."""

    def __init__(self, secrets: Iterable[str]) -> None:
        super().__init__()
        self.secrets = sorted({s for s in secrets if s}, key=len, reverse=True)

    def _clean(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, "***")
        return text

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.secrets:
            return True
        message = record.getMessage()
        cleaned = self._clean(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        for key, value in list(vars(record).items()):
            if key not in _STANDARD and not key.startswith("_") and isinstance(value, str):
                setattr(record, key, self._clean(value))
        return True


def quiet_libraries(access_log: bool = False) -> None:
    """Raise the threshold of loggers that would print URLs or one line per tick."""
    for name, level in _QUIET.items():
        if name == "uvicorn.access" and access_log:
            continue
        logging.getLogger(name).setLevel(level)


def configure(
    fmt: str = "text",
    level: str = "info",
    *,
    secrets: Iterable[str] = (),
    stream: TextIO | None = None,
    access_log: bool = False,
) -> None:
    """Send every log record to `stream` (stderr) as text or JSON lines."""
    handler = logging.StreamHandler(stream or sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(RedactFilter(secrets))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    quiet_libraries(access_log)
