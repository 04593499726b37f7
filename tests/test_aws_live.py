"""Against real AWS, read-only: runs only with GPUOPT_AWS_LIVE=1 and credentials configured.

    GPUOPT_AWS_LIVE=1 AWS_PROFILE=… pytest -m aws_live tests/test_aws_live.py

It lists offers in one region (DescribeInstanceTypes, DescribeAvailabilityZones,
DescribeInstanceTypeOfferings, DescribeSpotPriceHistory, pricing:GetProducts); it launches
nothing and costs nothing.
"""

from __future__ import annotations

import os
import re

import pytest

from optimizer.model import Market
from providers.aws import AwsProvider, aws_disabled_reason

pytestmark = pytest.mark.aws_live

REGION = os.environ.get("GPUOPT_AWS_LIVE_REGION", "us-east-1")


@pytest.fixture
def live() -> None:
    if os.environ.get("GPUOPT_AWS_LIVE") != "1":
        pytest.skip("set GPUOPT_AWS_LIVE=1 to run against real AWS")
    reason = aws_disabled_reason()
    if reason:
        pytest.skip(reason)


def test_live_offers_have_real_prices_and_zone_ids(live: None) -> None:
    aws = AwsProvider([REGION])
    offers = aws.fetch_offers()
    assert offers, aws.problems
    assert all(re.fullmatch(r"[a-z0-9]+-az\d+", o.zone or "") for o in offers)
    spot = [o for o in offers if o.market is Market.SPOT]
    on_demand = [o for o in offers if o.market is Market.ON_DEMAND]
    assert spot and all(o.usd_per_hour > 0.001 for o in spot)
    assert on_demand or any(p.startswith("pricing") for p in aws.problems)
    assert {o.source for o in offers} == {"aws-api"}
    assert all(o.gpu_count >= 1 and o.vcpus > 0 for o in offers)
