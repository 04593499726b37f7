"""Alerts: routing, the outbox, and the Slack and signed-webhook channels."""

from optimizer.alerts.channel import Alert, Notifier, SendResult
from optimizer.alerts.config import AlertsConfig, ChannelConfig, RetryConfig
from optimizer.alerts.outbox import Emitter, backoff, give_up
from optimizer.alerts.routing import SEVERITIES, Route, Router
from optimizer.alerts.slack import SlackNotifier, slack_message
from optimizer.alerts.webhook import WebhookNotifier, sign, verify_signature

__all__ = [
    "SEVERITIES",
    "Alert",
    "AlertsConfig",
    "ChannelConfig",
    "Emitter",
    "Notifier",
    "RetryConfig",
    "Route",
    "Router",
    "SendResult",
    "SlackNotifier",
    "WebhookNotifier",
    "backoff",
    "give_up",
    "sign",
    "slack_message",
    "verify_signature",
]
