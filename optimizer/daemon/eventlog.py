"""Jobs' events as log lines: what the daemon does with each job, as it does it.

Every event recorded about a job (submitted, launched, probing, running, interrupted,
relaunched, failed over, succeeded, failed, cancelled, removed, and the launch errors and
budget warnings on its way) becomes one line at the level of the event's severity (info:
INFO, warning: WARNING, error: ERROR; `job.interrupted` is a warning, `job.failed` an
error), written by `JobEventLog` once the
transaction that recorded it has committed (the store tells its listeners then, so a write
that rolled back logs nothing). The fields are stable, in this order, each only when known:

    event      the kind (`job.state_changed`, `job.interrupted`, …; docs/alerts.md)
    event_id   its id (GET /events/{id})
    job        the job's name
    attempt    the attempt's number (1, 2, …)
    instance   the attempt's instance id
    from, to   the states, for `job.state_changed`
    reason     why: the transition's reason, else the event's message
    policy     the job's policy
    severity   the event's (info, warning, error): a job's trouble, not the daemon's

In text logs the message is the fields as `key=value` pairs (a value with a space, a quote,
`=` or a control character is JSON-quoted), so one event is one line; in JSON logs it is the
same text, and each field is also a key of the line's object. Job specs, environments and
tokens are never fields; the log's redaction filter covers the fields too.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from typing import Any

from optimizer.store import EventRecord

log = logging.getLogger(__name__)

FIELDS = (
    "event",
    "event_id",
    "job",
    "attempt",
    "instance",
    "from",
    "to",
    "reason",
    "policy",
    "severity",
)
_BARE = re.compile(r"[^\s\"=\\\x00-\x1f\x7f]+")


def job_event_fields(record: EventRecord) -> dict[str, Any] | None:
    """The log fields of a job's event, in `FIELDS` order; None for other events."""
    if record.job_id is None:
        return None
    data = record.data or {}
    job = data.get("job")
    reason = data.get("reason")
    if not reason:
        reason = record.message
        prefix = f"job {job}: "
        if job and reason.startswith(prefix):
            reason = reason[len(prefix) :]
    values = {
        "event": record.kind,
        "event_id": record.id,
        "job": job,
        "attempt": data.get("attempt"),
        "instance": data.get("instance"),
        "from": data.get("from"),
        "to": data.get("to"),
        "reason": reason,
        "policy": record.policy,
        "severity": record.severity,
    }
    return {key: values[key] for key in FIELDS if values[key] not in (None, "")}


def logfmt(fields: dict[str, Any]) -> str:
    """`key=value …` on one line: a value that is not one plain word is JSON-quoted."""
    parts = []
    for key, value in fields.items():
        text = str(value)
        if not _BARE.fullmatch(text):
            text = json.dumps(text, ensure_ascii=False)
        parts.append(f"{key}={text}")
    return " ".join(parts)


LEVELS = {"info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def level_of(severity: str) -> int:
    """The log level of an event's severity (INFO for one this table does not know)."""
    return LEVELS.get(severity, logging.INFO)


class JobEventLog:
    """A store event listener (`store.events.listen`) that logs jobs' events."""

    def __init__(self, logger: logging.Logger = log) -> None:
        self.logger = logger

    def __call__(self, records: Sequence[EventRecord]) -> None:
        for record in records:
            fields = job_event_fields(record)
            if fields is not None:
                self.logger.log(level_of(record.severity), "%s", logfmt(fields), extra=fields)


__all__ = ["FIELDS", "LEVELS", "JobEventLog", "job_event_fields", "level_of", "logfmt"]
