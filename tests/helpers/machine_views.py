"""Attempt views for the state machine's tests."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from optimizer.jobs.machine import (
    AttemptView,
)

NOW = datetime(2026, 11, 30, 12, tzinfo=UTC)


POOL = ("aws", "eu-west-1", "euw1-az1", "p4d.24xlarge", "spot")


def attempt(**changes: Any) -> AttemptView:
    base = AttemptView(
        number=1,
        key="7-1",
        pool=POOL,
        launched_at=NOW - timedelta(minutes=5),
        registered=True,
        probe_status="pass",
        job_started=True,
    )
    return replace(base, **changes)
