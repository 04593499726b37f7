"""Slack incoming-webhook alerts as Block Kit: a header, the message with four fields
(what, job/policy, price before → after, severity) and a context line linking to the API.
The monthly cost summary shows its period and spend, with its figures as the fields (what,
spend, savings gross and net of overhead, top jobs, severity).

Limits kept (Slack Block Kit reference): header text <= 150 characters, section text <= 3000,
at most 10 fields of <= 2000 characters each, at most 10 context elements.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
from pydantic import SecretStr

from optimizer.alerts.channel import Alert, SendResult, post
from optimizer.alerts.channels import ChannelType, UrlChannelConfig
from optimizer.clock import Clock, utc_label, utc_now
from optimizer.costs.summary import savings_text, usd
from optimizer.model import EventKind

HEADER_MAX = 150
TEXT_MAX = 3000
FIELD_MAX = 2000
_ICONS = {"info": ":information_source:", "warning": ":warning:", "critical": ":rotating_light:"}


def escape(text: str) -> str:
    """Slack's three control characters (&, <, >) as entities, per its formatting guide."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _usd(value: float | None) -> str:
    return "—" if value is None else f"${value:,.4f}/h".replace(".0000/h", "/h")


def _price(alert: Alert) -> str:
    before, after = alert.price_before, alert.price_after
    if before is None and after is None:
        return "—"
    change = ""
    if before and after is not None:
        change = f" ({(after - before) / before:+.1%})"
    return f"{_usd(before)} → {_usd(after)}{change}"


def _subject(alert: Alert) -> str:
    parts = []
    if alert.job:
        parts.append(f"job `{escape(alert.job)}`")
    if alert.policy:
        parts.append(f"policy `{escape(alert.policy)}`")
    return ", ".join(parts) or "—"


def _summary(alert: Alert) -> tuple[str, list[tuple[str, str]]] | None:
    """A cost summary's section: its period and spend, then its figures as fields."""
    data = alert.data
    try:
        total, spend, storage = data["total_usd"], data["spend_usd"], data["storage_usd"]
        lead = (
            f"*{escape(str(data['period']))}*: {usd(total)} spent on {data['attempts']} "
            f"attempt(s) of {data['jobs']} job(s)"
        )
        jobs = "\n".join(
            f"`{escape(str(job['job']))}` {usd(job['total_usd'])}" for job in data["top_jobs"]
        )
        fields = [
            ("Spend", f"{usd(total)}: instances {usd(spend)}, root volumes {usd(storage)}"),
            ("Saved against on-demand", escape(savings_text(data))),
            ("Top jobs by spend", jobs or "none"),
        ]
    except (KeyError, TypeError, ValueError):
        return None  # not a summary this version can read: the plain layout
    return lead, fields


def slack_message(alert: Alert) -> dict[str, Any]:
    """The incoming-webhook body for one alert."""
    icon = _ICONS.get(alert.severity, ":grey_question:")
    severity = ("Severity", f"{icon} {escape(alert.severity)}")
    summary = _summary(alert) if alert.kind == EventKind.COSTS_MONTHLY_SUMMARY else None
    if summary is not None:
        text, figures = summary
        fields = [("What", escape(alert.title)), *figures, severity]
    else:
        text = escape(alert.message)
        fields = [
            ("What", escape(alert.title)),
            ("Job / policy", _subject(alert)),
            ("Price before → after", _price(alert)),
            severity,
        ]
    when = utc_label(alert.at)
    context = [f"gpuopt event {alert.event_id} · {when}"]
    if alert.link:
        context.insert(0, f"<{alert.link}|Open in the gpuopt API>")
    return {
        "text": _cut(escape(f"{alert.title}: {alert.message}"), TEXT_MAX),
        "blocks": [
            {
                "type": "header",
                "text": {"type": "plain_text", "text": _cut(alert.title, HEADER_MAX)},
            },
            {
                "type": "section",
                "text": {"type": "mrkdwn", "text": _cut(text, TEXT_MAX)},
                "fields": [
                    {"type": "mrkdwn", "text": _cut(f"*{name}*\n{value}", FIELD_MAX)}
                    for name, value in fields
                ],
            },
            {
                "type": "context",
                "elements": [{"type": "mrkdwn", "text": text} for text in context],
            },
        ],
    }


class SlackNotifier:
    """Posts alerts to one Slack incoming webhook."""

    def __init__(
        self, name: str, url: SecretStr, client: httpx.Client, *, clock: Clock = utc_now
    ) -> None:
        self.name = name
        self._url = url
        self._client = client
        self._clock = clock

    def __repr__(self) -> str:
        return f"SlackNotifier({self.name!r})"

    def send(self, alert: Alert) -> SendResult:
        body = json.dumps(slack_message(alert), ensure_ascii=False).encode("utf-8")
        return post(
            self._client,
            self._url.get_secret_value(),
            body,
            {"Content-Type": "application/json; charset=utf-8"},
            secrets=(),
            now=self._clock(),
        )


class SlackConfig(UrlChannelConfig):
    """`type: slack`: an incoming webhook's URL, which is the credential (no `secret`)."""

    secret_note = "the URL is the credential"


def _build(name: str, spec: SlackConfig, client: httpx.Client, clock: Clock) -> SlackNotifier:
    return SlackNotifier(name, spec.url, client, clock=clock)


# The Slack channel type, as the `gpuopt.alert_channels` entry point `slack` names it.
CHANNEL = ChannelType("slack", SlackConfig, _build)
