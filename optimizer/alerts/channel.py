"""What every alert channel shares: the alert as people read it, the send result, and one
HTTP POST that never lets a channel's URL or secret into an error message."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, Protocol
from urllib.parse import urlsplit

import httpx

from optimizer.clock import utc_text
from optimizer.model import EventKind, event_kind
from optimizer.store import OutboxItem

# A plain title for every kind the daemon raises (a test checks none is missing); a kind
# recorded by another version gets its name spelled out.
TITLES: dict[str, str] = {
    EventKind.BEST_OFFER_CHANGED: "Best offer changed",
    EventKind.BEST_OFFER_LOST: "No offer satisfies a policy",
    EventKind.PRICE_DROPPED: "Best offer got cheaper",
    EventKind.BID_CAP_CROSSED: "Spot price crossed a bid cap",
    EventKind.POLICY_LOADED: "Policy loaded",
    EventKind.POLICY_REJECTED: "Policy edit rejected",
    EventKind.POLICY_REMOVED: "Policy removed",
    EventKind.POLICY_KEPT: "Deleted policy kept in force",
    EventKind.POLICY_WINDOW_CHANGED: "Policy schedule window changed",
    EventKind.POLICY_SKIPPED: "Policy skipped by the reconciler",
    EventKind.POLL_FAILED: "Price poll failing",
    EventKind.POLL_RECOVERED: "Price poll recovered",
    EventKind.PROVIDER_DISABLED: "Provider disabled",
    EventKind.PROVIDER_QUOTA_EXCEEDED: "Provider quota reached",
    EventKind.PROVIDER_AUTH_FAILED: "Provider refused a launch",
    EventKind.JOB_SUBMITTED: "Job submitted",
    EventKind.JOB_CANCELLED: "Job cancelled",
    EventKind.JOB_REMOVED: "Job removed",
    EventKind.JOB_STATE_CHANGED: "Job state changed",
    EventKind.JOB_DEFERRED: "Job waiting to launch",
    EventKind.JOB_POLICY_MISSING: "Job's policy not loaded",
    EventKind.JOB_LAUNCH_FAILED: "Launch failed",
    EventKind.JOB_LAUNCH_TIMED_OUT: "Agent did not check in",
    EventKind.JOB_INTERRUPTED: "Job interrupted",
    EventKind.JOB_PROBE_FAILED: "GPU probe failed",
    EventKind.JOB_INSTANCE_LOST: "Instance lost",
    EventKind.JOB_INSTANCE_LEFT_TO_CLOUD: "Instance left for the cloud to end",
    EventKind.JOB_FENCE_LIFTED: "Job started before its earlier run was seen to end",
    EventKind.JOB_SUCCEEDED: "Job succeeded",
    EventKind.JOB_FAILED: "Job failed",
    EventKind.JOB_UNDERUSED: "GPU underused",
    EventKind.JOB_STOPPED: "Job stopped by a policy rule",
    EventKind.JOB_MIGRATED: "Job moved to other capacity",
    EventKind.JOB_SPARE_CHANGED: "Job's warm spare changed",
    EventKind.JOB_DEADLINE_AT_RISK: "Job's deadline at risk",
    EventKind.JOB_DEADLINE_MISSED: "Job's deadline missed",
    EventKind.BUDGET_THRESHOLD_CROSSED: "Budget nearly spent",
    EventKind.JOB_WARNING: "Job accepted with a warning",
    EventKind.CHECKPOINT_COMMITTED: "Checkpoint uploaded",
    EventKind.CHECKPOINT_RESTORED: "Checkpoint restored",
    EventKind.CHECKPOINT_FAILED: "Checkpoint upload failed",
    EventKind.INSTANCE_TYPE_DEMOTED: "Instance type's GPU probes keep failing",
    EventKind.COSTS_MONTHLY_SUMMARY: "Monthly cost summary",
    EventKind.LEADER_ELECTED: "Replica took the lead",
}
_RECEIVER_EXCERPT = 200


def title_for(kind: str) -> str:
    kind = event_kind(kind)
    return TITLES.get(kind, kind.replace(".", " ").replace("_", " ").capitalize())


@dataclass(frozen=True, slots=True)
class Alert:
    """One alert as channels render it: the event, its job, and a link to it in the API."""

    id: str  # the outbox dedupe key: stable across retries, for receivers to deduplicate
    event_id: int
    kind: str
    severity: str
    message: str
    at: datetime
    policy: str | None = None
    job: str | None = None
    data: Mapping[str, Any] = field(default_factory=dict)
    link: str | None = None

    @property
    def title(self) -> str:
        return title_for(self.kind)

    @property
    def price_before(self) -> float | None:
        value = self.data.get("price_before")
        return float(value) if isinstance(value, int | float) else None

    @property
    def price_after(self) -> float | None:
        value = self.data.get("price_after")
        return float(value) if isinstance(value, int | float) else None

    @classmethod
    def from_outbox(cls, item: OutboxItem, api_url: str | None) -> Alert:
        event = item.event
        link = f"{api_url.rstrip('/')}/events/{event.id}" if api_url else None
        return cls(
            id=item.dedupe_key,
            event_id=event.id,
            kind=event.kind,
            severity=event.severity,
            message=event.message,
            at=event.at,
            policy=event.policy,
            job=item.job_name,
            data=event.data or {},
            link=link,
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON body a webhook receives."""
        return {
            "id": self.id,
            "event_id": self.event_id,
            "kind": self.kind,
            "title": self.title,
            "severity": self.severity,
            "message": self.message,
            "at": utc_text(self.at),
            "policy": self.policy,
            "job": self.job,
            "price_before": self.price_before,
            "price_after": self.price_after,
            "link": self.link,
            "data": dict(self.data),
        }


@dataclass(frozen=True, slots=True)
class SendResult:
    """How one delivery attempt went. `permanent` failures are not retried."""

    ok: bool
    error: str = ""
    status: int | None = None
    retry_after_s: float | None = None
    permanent: bool = False
    unreachable: bool = False  # no answer at all: skip the channel's other alerts this pass


class Notifier(Protocol):
    """A configured channel that can send an alert."""

    name: str

    def send(self, alert: Alert) -> SendResult: ...


def redact(text: str, secrets: Iterable[str]) -> str:
    """`text` with every secret (URL, token, shared secret) replaced by ***."""
    for secret in sorted((s for s in secrets if s), key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def _retry_after(value: str | None, now: datetime) -> float | None:
    """Seconds to wait from a Retry-After header: delta-seconds or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - now).total_seconds())


# 4xx answers that mean "try later", not "this request can never succeed" (RFC 9110 §15.5).
_RETRYABLE_4XX = frozenset({408, 425, 429})


def post(
    client: httpx.Client,
    url: str,
    body: bytes,
    headers: Mapping[str, str],
    *,
    secrets: Iterable[str],
    now: datetime,
) -> SendResult:
    """POST `body`; the result's error never contains the URL or any secret."""
    hidden = [url, *secrets]
    try:
        response = client.post(url, content=body, headers=dict(headers))
    except httpx.TimeoutException:
        return SendResult(False, "timed out waiting for the receiver", unreachable=True)
    except httpx.LocalProtocolError as exc:  # ours (a header httpx will not send): never sends
        detail = redact(str(exc), hidden) or type(exc).__name__
        return SendResult(False, f"request refused before sending: {detail}", permanent=True)
    except httpx.TransportError as exc:
        detail = redact(str(exc), hidden) or type(exc).__name__
        return SendResult(False, f"connection failed: {detail}", unreachable=True)
    status = response.status_code
    if 200 <= status < 300:
        return SendResult(True, status=status)
    excerpt = redact(response.text[:_RECEIVER_EXCERPT].strip(), hidden)
    error = f"HTTP {status}" + (f": {excerpt}" if excerpt else "")
    permanent = 400 <= status < 500 and status not in _RETRYABLE_4XX
    return SendResult(
        False,
        error,
        status=status,
        retry_after_s=_retry_after(response.headers.get("retry-after"), now),
        permanent=permanent,
    )


def check_url(url: str) -> str | None:
    """None when `url` is usable for alerts, else why not (without repeating the URL)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "must be an http(s) URL"
    if parts.scheme == "http" and not _loopback(parts.hostname):
        return "must use https:// (http:// only to a loopback address)"
    return None


def _loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
