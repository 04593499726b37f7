"""Daemon logging: text or one JSON object per line, secrets redacted, chatty libraries quiet.

One record is one line whatever its text holds: a newline in a name that comes from outside
(a policy file's, a job's) would otherwise start a line of its own that reads like the
daemon's. The text format writes control characters in the message as escapes (`\\n`, `\\r`,
`\\t`, `\\x1b`, `\\u2028`); JSON escapes those below U+0020 itself, and the formatter escapes
the rest that line readers split on (DEL, C1, U+2028/U+2029).
"""

from __future__ import annotations

import json
import logging
import re
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


# Every character a terminal or a line reader may act on: C0 (newlines among them), DEL, C1
# (NEL, U+0085, ends a line for str.splitlines) and the Unicode line and paragraph separators.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
# What JSON leaves as it is of those: json.dumps escapes the C0 characters already.
_JSON_RAW = re.compile("[\x7f-\x9f\u2028\u2029]")


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    return _NAMED.get(char) or (
        f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}"
    )


def one_line(text: str) -> str:
    """`text` with every control character written as an escape: it prints as one line."""
    return _CONTROL.sub(_escape, text)


class TextFormatter(logging.Formatter):
    """`asctime level logger: message`, the message (its arguments put in) on one line; a
    traceback follows on lines of its own, as Python writes it."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        saved = record.message
        record.message = one_line(saved)
        try:
            return super().formatMessage(record)
        finally:
            record.message = saved


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
        return _JSON_RAW.sub(
            lambda m: f"\\u{ord(m.group()):04x}", json.dumps(out, ensure_ascii=False)
        )


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
        handler.setFormatter(TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(RedactFilter(secrets))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    quiet_libraries(access_log)
