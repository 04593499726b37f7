"""Shared by the tests: moved from tests/test_engine.py, which uses them too."""

from __future__ import annotations

from datetime import UTC, datetime
from functools import partial
from typing import Any

from optimizer.model import Market
from policies.schema import Policy
from tests.helpers.offers import P4DE_24XLARGE, make_offer

T0 = datetime(2026, 4, 23, 12, tzinfo=UTC)


offer = partial(
    make_offer,
    **P4DE_24XLARGE,
    region="eu-central-1",
    zone="euc1-az1",
    market=Market.ON_DEMAND,
    usd_per_hour=40.0,
    observed_at=T0,
    source="",
)


def policy(**sections: Any) -> Policy:
    """A policy that allows everything, with the given top-level sections set."""
    return Policy.model_validate(
        {"apiVersion": "gpuopt/v1", "kind": "Policy", "name": "test", **sections}
    )
