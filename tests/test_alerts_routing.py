"""Routing by kind and severity, the Slack message's limits, back-off, channel config."""

from __future__ import annotations

import random
from datetime import timedelta
from pathlib import Path

import pytest

from optimizer.alerts import Alert, RetryConfig, Route, Router, backoff, give_up, slack_message
from optimizer.alerts.slack import FIELD_MAX, HEADER_MAX, TEXT_MAX
from optimizer.daemon.config import ConfigError, load_config
from optimizer.model import EventKind
from tests.helpers import T0

pytestmark = pytest.mark.usefixtures("daemon_env")


def test_without_routes_every_event_goes_to_every_channel() -> None:
    router = Router([], ["ops", "pager"])
    assert router.channels_for("price.dropped", "info") == ("ops", "pager")
    assert Router([], []).channels_for("price.dropped", "critical") == ()


def test_routes_pick_channels_by_kind_glob_and_minimum_severity() -> None:
    router = Router(
        [
            Route(kinds=["policy.*"], exclude_kinds=["policy.loaded"], channels=["pager"]),
            Route(min_severity="warning", channels=["ops"]),
            Route(kinds=["price.dropped", "best_offer.changed"], channels=["ops"]),
        ],
        ["ops", "pager", "unused"],
    )
    assert router.channels_for("policy.rejected", "warning") == ("ops", "pager")
    assert router.channels_for("policy.loaded", "info") == ()
    assert router.channels_for("price.dropped", "info") == ("ops",)
    assert router.channels_for("poll.failed", "warning") == ("ops",)
    assert router.channels_for("job.submitted", "info") == ()


def test_routes_written_with_the_earlier_spellings_route_the_renamed_kinds_as_before() -> None:
    router = Router(
        [
            Route(kinds=["policy_*"], exclude_kinds=["policy_loaded"], channels=["pager"]),
            Route(kinds=["price_drop", "no_candidates", "job.pending"], channels=["ops"]),
        ],
        ["ops", "pager"],
    )
    assert router.channels_for(EventKind.POLICY_REJECTED, "warning") == ("pager",)
    assert router.channels_for(EventKind.POLICY_KEPT, "warning") == ("pager",)
    assert router.channels_for(EventKind.POLICY_LOADED, "info") == ()  # still excluded
    assert router.channels_for(EventKind.PRICE_DROPPED, "info") == ("ops",)
    assert router.channels_for(EventKind.BEST_OFFER_LOST, "warning") == ("ops",)
    assert router.channels_for(EventKind.JOB_DEFERRED, "warning") == ("ops",)
    # `policy_*` never matched a job's kinds, and does not start to
    assert router.channels_for(EventKind.JOB_POLICY_MISSING, "error") == ()
    assert router.channels_for(EventKind.BEST_OFFER_CHANGED, "info") == ()


def test_backoff_doubles_up_to_the_cap_with_jitter_between_half_and_full() -> None:
    retry = RetryConfig(base_s=5, max_s=60)
    rng = random.Random(1)
    for attempts, full in [(1, 5), (2, 10), (3, 20), (4, 40), (5, 60), (30, 60)]:
        wait = backoff(attempts, retry, rng).total_seconds()
        assert full / 2 <= wait <= full
    same = [backoff(3, retry, random.Random(9)) for _ in range(2)]
    assert same[0] == same[1]  # a seeded source gives the same schedule


def test_an_alert_is_given_up_after_its_attempts_or_its_age() -> None:
    retry = RetryConfig(max_attempts=3, max_age_hours=2)
    assert not give_up(2, T0, T0 + timedelta(hours=1), retry)
    assert give_up(3, T0, T0, retry)
    assert give_up(1, T0, T0 + timedelta(hours=2), retry)


def test_a_slack_message_keeps_to_block_kit_limits_and_escapes_control_characters() -> None:
    alert = Alert(
        id="k",
        event_id=3,
        kind="x" * 400,
        severity="critical",
        message="<@here> & " + "m" * 5000,
        at=T0,
        job="train",
        policy="p",
    )
    message = slack_message(alert)
    header, section, context = message["blocks"]
    assert len(header["text"]["text"]) == HEADER_MAX
    assert len(section["text"]["text"]) == TEXT_MAX
    assert section["text"]["text"].startswith("&lt;@here&gt; &amp; ")
    assert all(len(f["text"]) <= FIELD_MAX for f in section["fields"])
    assert section["fields"][1]["text"] == "*Job / policy*\njob `train`, policy `p`"
    assert section["fields"][2]["text"].endswith("—")  # no prices on this event
    assert context["elements"] == [
        {"type": "mrkdwn", "text": "gpuopt event 3 · 2026-01-15 12:00:00 UTC"}
    ]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "gpuopt.yaml"
    path.write_text(text)
    return path


def test_channel_config_errors_are_located_and_never_repeat_the_url(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "alerts:\n"
        "  channels:\n"
        "    ops:\n"
        "      type: slack\n"
        "      url: http://hooks.example.com/services/SECRET-PATH\n"
        "    hook:\n"
        "      type: webhook\n"
        "      url: https://example.com/hook\n"
        "    short:\n"
        "      type: webhook\n"
        "      url: https://example.com/hook\n"
        "      secret: tooshort\n",
    )
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    lines = [str(p) for p in caught.value.problems]
    assert lines == [
        f"{path}:5:12: alerts.channels.ops.url: must use https:// (http:// only to a loopback "
        "address)",
        f"{path}:7:7: alerts.channels.hook: a webhook channel needs `secret` (receivers verify "
        "the signature)",
        f"{path}:12:15: alerts.channels.short.secret: must be at least 16 characters",
    ]
    assert "SECRET-PATH" not in str(caught.value) and "tooshort" not in str(caught.value)


def test_a_route_naming_an_unknown_channel_is_an_error(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "alerts:\n"
        "  channels:\n"
        "    ops: {type: slack, url: 'https://hooks.slack.com/services/T/B/x'}\n"
        "  routes:\n"
        "    - {kinds: ['policy_*'], channels: [pager]}\n",
    )
    with pytest.raises(ConfigError, match=r"routes\[0\] names channel 'pager'"):
        load_config(path)


def test_an_unknown_channel_type_names_the_installed_ones(tmp_path: Path) -> None:
    from optimizer.alerts.channels import channel_types

    path = write(
        tmp_path,
        "alerts:\n  channels:\n    pager: {type: pagerduty, url: 'https://events.example.com/x'}\n",
    )
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    known = ", ".join(sorted(channel_types()))
    assert f"{path}:3:19: alerts.channels.pager.type: unknown channel type 'pagerduty'; " in str(
        caught.value
    )
    assert f"known types: {known}" in str(caught.value)


def test_each_channel_type_builds_its_notifier_through_the_table() -> None:
    import httpx

    from optimizer.alerts.channels import ChannelConfig, build_notifiers, channel_types
    from optimizer.alerts.slack import SlackNotifier
    from optimizer.alerts.webhook import WebhookNotifier
    from optimizer.clock import ManualClock

    channels = {
        "ops": ChannelConfig.of({"type": "slack", "url": "https://hooks.slack.com/services/T/B/x"}),
        "hook": ChannelConfig.of(
            {"type": "webhook", "url": "https://example.com/hook", "secret": "s" * 20}
        ),
    }
    with httpx.Client() as client:
        built = build_notifiers(channels, client, ManualClock(T0))
    assert isinstance(built["ops"], SlackNotifier) and built["ops"].name == "ops"
    assert isinstance(built["hook"], WebhookNotifier) and built["hook"].name == "hook"
    assert {"slack", "webhook"} <= set(channel_types())  # found through entry points
