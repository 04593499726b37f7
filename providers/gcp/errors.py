"""GCP error codes → gpuopt's typed provider errors, in one place.

Two shapes reach us. An HTTP error (`{"error": {"code": 403, "message": …, "errors":
[{"reason": "rateLimitExceeded", …}]}}`), which google-api-core raises as a
`GoogleAPICallError` with `.code`, `.errors` and `.reason`; and a finished Operation whose
`error.errors[]` carry codes such as `ZONE_RESOURCE_POOL_EXHAUSTED` with `errorDetails`
(`errorInfo`, `quotaInfo`). Both are reduced to codes + status + message and classified by
`classify`. Codes and scopes: REFERENCE.md §2.6 (SkyPilot's `_gcp_handler`, kubernetes/k8s.io
#9834) and the Compute API error docs (https://cloud.google.com/compute/docs/troubleshooting/
troubleshooting-vm-creation).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from providers.base import (
    AuthError,
    CapacityError,
    ProviderError,
    QuotaError,
    ThrottledError,
)

PROVIDER = "gcp"


def _norm(code: str) -> str:
    """`ZONE_RESOURCE_POOL_EXHAUSTED`, `zoneResourcePoolExhausted` → one comparable form."""
    return re.sub(r"[^A-Z0-9]", "", code.upper())


# A stockout in the zone: block (type, zone), try elsewhere. The `_WITH_DETAILS` variant was
# once missed by SkyPilot and broke its failover (skypilot#831).
CAPACITY_CODES = frozenset(
    _norm(c)
    for c in (
        "ZONE_RESOURCE_POOL_EXHAUSTED",
        "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
        "insufficientCapacity",
    )
)
QUOTA_CODES = frozenset(_norm(c) for c in ("QUOTA_EXCEEDED", "quotaExceeded"))
# API request rates (HTTP 403 usageLimits/rateLimitExceeded, or 429) and per-zone operation
# rates: slow down, the placement itself is fine.
THROTTLE_CODES = frozenset(
    _norm(c)
    for c in (
        "rateLimitExceeded",
        "userRateLimitExceeded",
        "RATE_LIMIT_EXCEEDED",
        "RESOURCE_OPERATION_RATE_EXCEEDED",
    )
)
AUTH_STATUSES = frozenset({401, 403})
ALREADY_EXISTS_CODES = frozenset(_norm(c) for c in ("alreadyExists", "RESOURCE_ALREADY_EXISTS"))
# A delete refused because another resource still uses the one named (a resource policy a VM
# names): HTTP 400 reason `resourceInUseByAnotherResource`, or an Operation error
# `RESOURCE_IN_USE_BY_ANOTHER_RESOURCE` (Compute API error docs).
IN_USE_CODES = frozenset(
    _norm(c) for c in ("resourceInUseByAnotherResource", "RESOURCE_IN_USE_BY_ANOTHER_RESOURCE")
)
# "Quota 'NVIDIA_T4_GPUS' exceeded.  Limit: 0.0 in region us-central1."
_QUOTA_IN_MESSAGE = re.compile(r"Quota '([^']+)' exceeded")


@dataclass(frozen=True, slots=True)
class ErrorFacts:
    """What one failure says, reduced to plain values."""

    codes: tuple[str, ...] = ()
    status: int | None = None  # HTTP status, where the failure was an HTTP error
    message: str = ""
    quota_metrics: tuple[str, ...] = field(default=())


def classify(facts: ErrorFacts, *, zone: str | None = None) -> ProviderError:
    """The typed error for one failure; CapacityError and QuotaError carry the zone tried."""
    normed = [(_norm(c), c) for c in facts.codes if c]
    message = facts.message or (facts.codes[0] if facts.codes else "GCP request failed")
    first = facts.codes[0] if facts.codes else (str(facts.status) if facts.status else "")

    def code_in(group: frozenset[str]) -> str | None:
        return next((raw for key, raw in normed if key in group), None)

    if code := code_in(CAPACITY_CODES):
        where = f" in {zone}" if zone else ""
        return CapacityError(
            f"no capacity{where}: {message}", provider=PROVIDER, code=code, zone=zone
        )
    if (code := code_in(THROTTLE_CODES)) or facts.status == 429:
        return ThrottledError(message, provider=PROVIDER, code=code or first, zone=zone)
    if code := code_in(QUOTA_CODES):
        metrics = facts.quota_metrics or tuple(_QUOTA_IN_MESSAGE.findall(message))
        named = f"quota {', '.join(metrics)} exceeded: " if metrics else "quota exceeded: "
        return QuotaError(named + message, provider=PROVIDER, code=code, zone=zone)
    if facts.status in AUTH_STATUSES:
        return AuthError(message, provider=PROVIDER, code=first, zone=zone)
    return ProviderError(message, provider=PROVIDER, code=first, zone=zone)


def is_already_exists(facts: ErrorFacts) -> bool:
    """True when an insert failed only because the instance is already there."""
    return facts.status == 409 or any(_norm(c) in ALREADY_EXISTS_CODES for c in facts.codes)


def is_in_use(facts: ErrorFacts) -> bool:
    """True when a delete failed because another resource still uses the one named."""
    return any(_norm(c) in IN_USE_CODES for c in facts.codes)


# --- reading the two shapes ---------------------------------------------------------------------


def _get(obj: Any, name: str, default: Any = None) -> Any:
    """Attribute of a proto-plus message or key of a dict (the JSON shape)."""
    if isinstance(obj, dict):
        camel = re.sub(r"_([a-z])", lambda m: m.group(1).upper(), name)
        return obj.get(name, obj.get(camel, default))
    return getattr(obj, name, default)


def _quota_metrics(details: Iterable[Any]) -> list[str]:
    found: list[str] = []
    for detail in details or ():
        info = _get(detail, "quota_info")
        metric = _get(info, "metric_name") if info else None
        if metric:
            found.append(str(metric))
    return found


def operation_facts(errors: Sequence[Any]) -> ErrorFacts:
    """Facts from an Operation's `error.errors[]` (messages or their JSON dicts)."""
    codes: list[str] = []
    messages: list[str] = []
    metrics: list[str] = []
    for entry in errors:
        code = str(_get(entry, "code", "") or "")
        text = str(_get(entry, "message", "") or "")
        codes.append(code)
        if text:
            messages.append(text)
        from_text = _QUOTA_IN_MESSAGE.findall(text)
        metrics.extend(from_text or _quota_metrics(_get(entry, "error_details", ()) or ()))
    return ErrorFacts(tuple(codes), None, "; ".join(messages), tuple(dict.fromkeys(metrics)))


def exception_facts(exc: BaseException) -> ErrorFacts | None:
    """Facts from an exception raised by a google-cloud client; None for anything else."""
    from google.api_core import exceptions as core

    if isinstance(exc, core.GoogleAPICallError):
        codes = [str(e.get("reason", "")) for e in exc.errors or () if isinstance(e, dict)]
        if exc.reason:
            codes.append(str(exc.reason))
        status = exc.code if isinstance(exc.code, int) else None
        text = exc.message or str(exc)
        return ErrorFacts(tuple(c for c in codes if c), status, text, ())
    if isinstance(exc, core.RetryError):
        cause = exc.cause
        return exception_facts(cause) if cause is not None else ErrorFacts(message=str(exc))
    return None


def from_exception(exc: BaseException, *, zone: str | None = None) -> ProviderError | None:
    """The typed error for a client exception, or None when it is not a cloud failure."""
    from google.auth import exceptions as auth

    if isinstance(exc, auth.RefreshError | auth.DefaultCredentialsError):
        return AuthError(f"GCP credentials rejected: {exc}", provider=PROVIDER)
    if isinstance(exc, auth.TransportError):
        return ProviderError(f"GCP unreachable: {exc}", provider=PROVIDER, zone=zone)
    facts = exception_facts(exc)
    if facts is not None:
        return classify(facts, zone=zone)
    import requests

    if isinstance(exc, requests.RequestException):
        return ProviderError(f"GCP unreachable: {exc}", provider=PROVIDER, zone=zone)
    return None


@contextmanager
def translated(*, zone: str | None = None) -> Iterator[None]:
    """Re-raise client exceptions as typed provider errors (the cause kept)."""
    try:
        yield
    except ProviderError:
        raise
    except Exception as exc:
        mapped = from_exception(exc, zone=zone)
        if mapped is None:
            raise
        raise mapped from exc
