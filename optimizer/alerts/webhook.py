"""Generic webhook alerts: a JSON body signed with HMAC-SHA256 over `<timestamp>.<body>`.

Headers: `X-Gpuopt-Timestamp: <unix seconds>` and `X-Gpuopt-Signature: sha256=<hex>`, plus
`X-Gpuopt-Event` (the kind) and `X-Gpuopt-Delivery` (the hex SHA-256 of the alert id, the
same on every retry: the id holds names from outside, a policy file's among them, and a
header can hold no newline).
A receiver recomputes the HMAC with the shared secret, compares in constant time, and rejects
timestamps more than a few minutes away from its own clock: `verify_signature` does both.
docs/alerts.md walks through it.
"""

from __future__ import annotations

import hashlib
import hmac
import json

import httpx
from pydantic import SecretStr

from optimizer.alerts.channel import Alert, SendResult, post
from optimizer.alerts.channels import ChannelType, UrlChannelConfig
from optimizer.clock import Clock, utc_now

TIMESTAMP_HEADER = "X-Gpuopt-Timestamp"
SIGNATURE_HEADER = "X-Gpuopt-Signature"
EVENT_HEADER = "X-Gpuopt-Event"
DELIVERY_HEADER = "X-Gpuopt-Delivery"
SIGNATURE_PREFIX = "sha256="
DEFAULT_TOLERANCE_S = 300


def _as_bytes(value: str | bytes) -> bytes:
    return value.encode("utf-8") if isinstance(value, str) else value


def sign(secret: str | bytes, timestamp: int | str, body: str | bytes) -> str:
    """`sha256=<hex HMAC-SHA256 of "<timestamp>.<body>">`."""
    message = _as_bytes(str(timestamp)) + b"." + _as_bytes(body)
    digest = hmac.new(_as_bytes(secret), message, hashlib.sha256).hexdigest()
    return SIGNATURE_PREFIX + digest


def verify_signature(
    secret: str | bytes,
    timestamp: str | int | None,
    body: str | bytes,
    signature: str | None,
    *,
    now: float,
    tolerance_s: float = DEFAULT_TOLERANCE_S,
) -> bool:
    """True when `signature` is the HMAC of `timestamp.body` and `timestamp` is within
    `tolerance_s` of `now` (unix seconds). What a receiver runs on every request."""
    if timestamp is None or signature is None:
        return False
    try:
        sent = int(str(timestamp).strip())
    except ValueError:
        return False
    if abs(now - sent) > tolerance_s:
        return False  # too old (a replay) or too far ahead (a wrong clock)
    expected = sign(secret, str(timestamp).strip(), body)
    return hmac.compare_digest(expected.encode("ascii"), signature.strip().encode("utf-8"))


def delivery_id(alert_id: str) -> str:
    """The `X-Gpuopt-Delivery` value: the hex SHA-256 of the alert id, so the header is 64
    hex digits whatever the id holds, and the same on every retry."""
    return hashlib.sha256(alert_id.encode("utf-8", "surrogatepass")).hexdigest()


class WebhookNotifier:
    """Posts signed JSON alerts to one URL."""

    def __init__(
        self,
        name: str,
        url: SecretStr,
        secret: SecretStr,
        client: httpx.Client,
        *,
        clock: Clock = utc_now,
    ) -> None:
        self.name = name
        self._url = url
        self._secret = secret
        self._client = client
        self._clock = clock

    def __repr__(self) -> str:
        return f"WebhookNotifier({self.name!r})"

    def send(self, alert: Alert) -> SendResult:
        body = json.dumps(alert.to_dict(), sort_keys=True, separators=(",", ":")).encode()
        now = self._clock()
        timestamp = str(int(now.timestamp()))
        secret = self._secret.get_secret_value()
        headers = {
            "Content-Type": "application/json",
            TIMESTAMP_HEADER: timestamp,
            SIGNATURE_HEADER: sign(secret, timestamp, body),
            EVENT_HEADER: alert.kind,
            DELIVERY_HEADER: delivery_id(alert.id),
        }
        return post(
            self._client, self._url.get_secret_value(), body, headers, secrets=[secret], now=now
        )


class WebhookConfig(UrlChannelConfig):
    """`type: webhook`: any HTTP endpoint, and the shared secret its bodies are signed with."""

    needs_secret = True
    secret_note = "receivers verify the signature"


def _build(name: str, spec: WebhookConfig, client: httpx.Client, clock: Clock) -> WebhookNotifier:
    assert spec.secret is not None  # the model refuses a webhook without one
    return WebhookNotifier(name, spec.url, spec.secret, client, clock=clock)


# The webhook channel type, as the `gpuopt.alert_channels` entry point `webhook` names it.
CHANNEL = ChannelType("webhook", WebhookConfig, _build)
