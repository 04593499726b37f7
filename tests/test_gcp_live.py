"""Against real GCP: read-only calls (offers); runs only when asked for and configured.

GPUOPT_GCP_LIVE=1 GPUOPT_GCP_PROJECT=my-project pytest -m gcp_live tests/test_gcp_live.py
"""

from __future__ import annotations

import os

import pytest

from optimizer.model import Market

pytestmark = pytest.mark.gcp_live


@pytest.fixture
def live_provider():
    if os.environ.get("GPUOPT_GCP_LIVE") != "1":
        pytest.skip("set GPUOPT_GCP_LIVE=1 to call the real GCP APIs")
    from providers.gcp import gcp_disabled_reason, make_gcp_provider

    reason = gcp_disabled_reason()
    if reason is not None:
        pytest.skip(f"GCP not configured: {reason}")
    provider = make_gcp_provider()
    yield provider
    provider.close()


def test_live_offers_in_us_central1(live_provider) -> None:
    offers = live_provider.fetch_offers(["us-central1"])
    assert offers, live_provider.problems
    assert {o.region for o in offers} == {"us-central1"}
    assert all(o.zone and o.usd_per_hour > 0 for o in offers)
    markets = {o.market for o in offers}
    assert markets == {Market.ON_DEMAND, Market.SPOT}
    t4 = [o for o in offers if o.gpu_model == "T4" and o.market is Market.ON_DEMAND]
    # T4 has cost $0.35/GPU-hour in Iowa for years (cloud.google.com/compute/gpus-pricing).
    assert t4 and min(o.usd_per_hour for o in t4) > 0.35
