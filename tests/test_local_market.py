"""The local cloud plays the market: pinned prices (for good or for a while, on the cloud's
own clock) and pools without capacity, set from Python or from `gpuopt local` in another
process, seen by the running cloud."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from optimizer.clock import ManualClock
from optimizer.model import Market, Offer
from providers.base import CapacityError, InstanceState, LaunchSpec
from providers.local import LocalCloud
from providers.local.market import check_pool, pool_name
from tests.helpers import T0, local_cloud, run_gpuopt

SPOT = "g4dn.xlarge@eu-central-1-a"
ON_DEMAND = "g4dn.xlarge@eu-central-1"


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


@pytest.fixture
def cloud(tmp_path: Path, clock: ManualClock) -> Iterator[LocalCloud]:
    with local_cloud(
        tmp_path / "local-cloud", tick_s=0.05, clock=lambda: clock().timestamp()
    ) as local:
        yield local


def prices(cloud: LocalCloud) -> dict[str, float]:
    return {pool_name(o): o.usd_per_hour for o in cloud.fetch_offers(["eu-central-1"])}


def offer_of(cloud: LocalCloud, name: str) -> Offer:
    return next(o for o in cloud.fetch_offers(["eu-central-1"]) if pool_name(o) == name)


def test_a_pinned_price_replaces_the_walk_for_that_pool_only(
    cloud: LocalCloud, clock: ManualClock
) -> None:
    before = prices(cloud)
    cloud.pin_price(SPOT, 7.5)
    cloud.pin_price(ON_DEMAND, 0.25)
    after = prices(cloud)
    assert after[SPOT] == 7.5 and after[ON_DEMAND] == 0.25
    assert {k: v for k, v in after.items() if k not in (SPOT, ON_DEMAND)} == {
        k: v for k, v in before.items() if k not in (SPOT, ON_DEMAND)
    }
    clock.advance(hours=30)  # the walk moves on; the pin holds
    assert prices(cloud)[SPOT] == 7.5
    assert offer_of(cloud, SPOT).market is Market.SPOT
    cloud.pin_price(SPOT, None)
    assert prices(cloud)[SPOT] != 7.5


def test_a_pin_for_a_while_ends_on_the_clouds_clock(
    tmp_path: Path, cloud: LocalCloud, clock: ManualClock
) -> None:
    unpinned = LocalCloud(tmp_path / "another", clock=lambda: clock().timestamp())
    cloud.pin_price(SPOT, 9.0, for_s=600)
    clock.advance(599)
    assert prices(cloud)[SPOT] == 9.0
    clock.advance(1)
    assert prices(cloud)[SPOT] == prices(unpinned)[SPOT] != 9.0  # the walk again


def test_an_unavailable_pool_stays_listed_and_refuses_launches_until_available(
    cloud: LocalCloud,
) -> None:
    spot = offer_of(cloud, SPOT)
    cloud.set_capacity(SPOT, available=False)
    assert SPOT in prices(cloud)  # the price is still published
    with pytest.raises(CapacityError) as caught:
        cloud.launch(spot, LaunchSpec(job="j", attempt=1, bootstrap="sleep 30"), "j-1")
    assert caught.value.code == "InsufficientInstanceCapacity" and caught.value.zone == spot.zone
    other = offer_of(cloud, "g4dn.xlarge@eu-central-1-b")
    cloud.launch(other, LaunchSpec(job="k", attempt=1, bootstrap="sleep 30"), "k-1")
    cloud.set_capacity(SPOT, available=True)
    ref = cloud.launch(spot, LaunchSpec(job="j", attempt=1, bootstrap="sleep 30"), "j-1")
    assert cloud.describe([ref])[0].state is InstanceState.RUNNING


def test_pools_are_checked_against_the_clouds_offers(cloud: LocalCloud) -> None:
    offers = cloud.fetch_offers()
    assert check_pool(SPOT, offers) == SPOT
    for bad, said in (
        ("g4dn.xlarge", "is not a pool: write TYPE@ZONE"),
        ("warp.9x@eu-central-1-a", "offers no instance type 'warp.9x'"),
        ("g4dn.xlarge@eu-central-1-c", "pools of g4dn.xlarge: g4dn.xlarge@eu-central-1, "),
    ):
        with pytest.raises(ValueError, match=said):
            check_pool(bad, offers)
    with pytest.raises(ValueError, match="--usd must be a price above 0"):
        cloud.pin_price(SPOT, 0.0)


def test_gpuopt_local_price_and_capacity_reach_the_running_cloud(
    tmp_path: Path, cloud: LocalCloud, clock: ManualClock
) -> None:
    pinned = run_gpuopt(tmp_path, "local", "price", SPOT, "--usd", "3.25", "--for", "10m")
    assert pinned.returncode == 0, pinned.stderr
    assert f"{SPOT}: price pinned at $3.2500/h for 10m" in pinned.stdout
    # The running cloud starts the pin's ten minutes on its own clock when it first sees it.
    assert prices(cloud)[SPOT] == 3.25
    clock.advance(minutes=10)
    assert prices(cloud)[SPOT] != 3.25

    taken = run_gpuopt(tmp_path, "local", "capacity", SPOT, "--unavailable")
    assert taken.returncode == 0, taken.stderr
    with pytest.raises(CapacityError):
        cloud.launch(offer_of(cloud, SPOT), LaunchSpec(job="j", attempt=1, bootstrap="true"), "j")

    wrong = run_gpuopt(tmp_path, "local", "price", "g4dn.xlarge@eu-central-1-c", "--usd", "1")
    assert wrong.returncode == 2
    assert wrong.stderr.startswith("gpuopt: error: the local cloud has no pool")
    neither = run_gpuopt(tmp_path, "local", "capacity", SPOT)
    assert neither.returncode == 2 and "--available or --unavailable" in neither.stderr
