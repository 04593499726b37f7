"""The latest offers' table, kept between rankings and rebuilt when a poll changes them
(optimizer/jobs/offer_table.py): launches, GET /offers and the migration pass rank it."""

from __future__ import annotations

import gc
import weakref
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from optimizer.jobs.offer_table import keeper, latest_table
from optimizer.jobs.ranking import launch_ranking
from optimizer.model import Interconnect, Market, Offer, Pool
from optimizer.store import Store
from policies.engine import Ranking, evaluate
from policies.schema import Policy
from tests.helpers import make_offer
from tests.helpers.offers import P4D_24XLARGE, T0

NOW = T0 + timedelta(minutes=5)
POLICY = Policy.model_validate(
    {"apiVersion": "gpuopt/v1", "kind": "Policy", "name": "any", "max_price_age_hours": 6}
)
# Rejects some offers by shape (8 GPUs wanted) and some by price, so rejections are compared.
PICKY = Policy.model_validate(
    {
        "apiVersion": "gpuopt/v1",
        "kind": "Policy",
        "name": "picky",
        "workload": {"gpus": 8},
        "bid": {"max_usd_per_hour": 30},
        "max_price_age_hours": 6,
    }
)
GCP_A2: dict[str, Any] = {
    "provider": "gcp",
    "region": "europe-west4",
    "zone": None,
    "instance_type": "a2-highgpu-8g",
    "gpu_model": "A100-40GB",
    "gpu_count": 8,
    "gpu_memory_gib": 40.0,
    "vcpus": 96,
    "ram_gib": 680.0,
    "interconnect": Interconnect.NVLINK,
}


def poll(provider: str, price: float, at: timedelta = timedelta(0)) -> list[Offer]:
    """One provider's offers as a poll at T0 + `at` finds them: every price is `price` plus
    a step per offer, so their order is known."""
    observed = T0 + at
    if provider == "gcp":
        return [
            make_offer(**GCP_A2, market=m, usd_per_hour=price + i, observed_at=observed)
            for i, m in enumerate((Market.SPOT, Market.ON_DEMAND))
        ]
    zones = ("use1-az1", "use1-az2", "use1-az4")
    return [
        *(
            make_offer(zone=z, usd_per_hour=price + i / 10, observed_at=observed)
            for i, z in enumerate(zones)
        ),
        *(
            make_offer(**P4D_24XLARGE, zone=z, usd_per_hour=price * 10 + i, observed_at=observed)
            for i, z in enumerate(zones)
        ),
        make_offer(
            **P4D_24XLARGE,
            zone=None,
            market=Market.ON_DEMAND,
            usd_per_hour=32.77,
            observed_at=observed,
        ),
    ]


def same(ours: Ranking, fresh: Ranking) -> None:
    assert list(ours.candidates) == list(fresh.candidates)
    assert [(r.offer, r.rule, r.reason) for r in ours.rejections] == [
        (r.offer, r.rule, r.reason) for r in fresh.rejections
    ]


def test_a_launch_ranking_after_a_poll_sees_the_new_prices(store: Store) -> None:
    store.prices.record_offers([*poll("aws", 0.40), *poll("gcp", 1.0)])
    before = launch_ranking(store, "any", POLICY, NOW).ranking
    assert before.best is not None and before.best.offer.usd_per_hour == 0.40

    store.prices.record_offers(poll("aws", 2.0, at=timedelta(minutes=1)))  # AWS got dearer
    after = launch_ranking(store, "any", POLICY, NOW).ranking
    assert after.best is not None
    assert (after.best.offer.provider, after.best.offer.usd_per_hour) == ("gcp", 1.0)
    prices = sorted(c.offer.usd_per_hour for c in after.candidates if c.offer.provider == "aws")
    assert prices[0] == 2.0 and 0.40 not in prices


def test_the_table_is_kept_until_a_poll_changes_the_offers(store: Store) -> None:
    store.prices.record_offers([*poll("aws", 0.40), *poll("gcp", 1.0)])
    first = latest_table(store)
    assert latest_table(store) is first  # nothing new: the same table, not rebuilt
    assert store.prices.record_offers([]) == 0
    assert latest_table(store) is first  # a poll that wrote nothing changes nothing

    store.prices.record_offers(poll("gcp", 1.5, at=timedelta(minutes=1)))
    second = latest_table(store)
    assert second is not first
    assert second.offers == tuple(store.prices.latest_offers())


def counted_reads(store: Store, monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Each read of the latest offers from here on, by its filters."""
    reads: list[dict[str, Any]] = []
    original = store.prices.latest_offers

    def counted(**kwargs: Any) -> list[Offer]:
        reads.append(kwargs)
        return original(**kwargs)

    monkeypatch.setattr(store.prices, "latest_offers", counted)
    return reads


def test_this_process_polls_reach_the_kept_table_without_a_read(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.prices.record_offers([*poll("aws", 0.40), *poll("gcp", 1.0)])
    latest_table(store)
    stored = store.prices.latest_offers
    reads = counted_reads(store, monkeypatch)
    store.prices.record_offers(poll("gcp", 1.5, at=timedelta(minutes=1)))
    # Older than the kept prices: history only, as the store's latest rows have it.
    store.prices.record_offers(poll("aws", 9.0, at=-timedelta(minutes=1)))
    table = latest_table(store)

    assert reads == []
    assert table.offers == tuple(stored())
    assert min(o.observed_at for o in table.offers) == T0  # the older poll is not there


def test_a_poll_that_adds_a_pool_has_its_providers_offers_read_again(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.prices.record_offers([*poll("aws", 0.40), *poll("gcp", 1.0)])
    latest_table(store)
    stored = store.prices.latest_offers
    reads = counted_reads(store, monkeypatch)
    added = make_offer(zone="use1-az6", usd_per_hour=0.1, observed_at=T0 + timedelta(minutes=1))
    store.prices.record_offers([*poll("aws", 0.5, at=timedelta(minutes=1)), added])
    table = latest_table(store)

    assert reads == [{"provider": "aws"}]
    assert table.offers == tuple(stored())
    assert added in table.offers


def test_the_kept_table_ranks_exactly_as_one_built_from_the_stored_offers(store: Store) -> None:
    store.prices.record_offers([*poll("aws", 0.40), *poll("gcp", 1.0)])
    latest_table(store)
    # Polls that change one provider's prices (the kept table is updated, not read whole),
    # some to equal prices (the tie-break's order), and a pool cooled by a failed launch.
    store.prices.record_offers(poll("aws", 1.0, at=timedelta(minutes=1)))
    store.prices.record_offers(poll("gcp", 0.5, at=timedelta(minutes=2)))
    builds = keeper(store).builds
    kept = latest_table(store)
    assert keeper(store).builds == builds + 1
    stored = store.prices.latest_offers()
    assert kept.offers == tuple(stored)
    for policy in (POLICY, PICKY):
        same(evaluate(policy, kept, NOW), evaluate(policy, stored, NOW))

    cooled = Pool("aws", "us-east-1", "use1-az2", "p4d.24xlarge", "spot")
    ranked = launch_ranking(store, "picky", PICKY, NOW, avoid=[cooled])
    rest = [o for o in stored if o.pool != cooled]
    assert ranked.held_back == 1
    same(ranked.ranking, evaluate(PICKY, rest, NOW))


def test_another_processs_poll_is_seen(tmp_path: Path) -> None:
    """A follower serves GET /offers from offers the leader polled: its kept table follows
    the database, not only its own writes."""
    url = f"sqlite:///{tmp_path / 'gpuopt.db'}"
    with Store(url) as follower, Store(url) as leader:
        follower.create_all()
        leader.prices.record_offers(poll("aws", 0.40))
        first = latest_table(follower)
        assert min(o.usd_per_hour for o in first.offers) == 0.40

        leader.prices.record_offers(poll("aws", 2.0, at=timedelta(minutes=1)))
        leader.prices.record_offers(poll("gcp", 1.0, at=timedelta(minutes=1)))
        kept = latest_table(follower)
        assert kept.offers == tuple(follower.prices.latest_offers())
        assert {o.provider for o in kept.offers} == {"aws", "gcp"}
        assert min(o.usd_per_hour for o in kept.offers if o.provider == "aws") == 2.0


def test_a_closed_stores_table_is_let_go(tmp_path: Path) -> None:
    """The kept table lives as long as its store, not for the process's life (a test suite,
    the CLI, open many stores)."""
    with Store(f"sqlite:///{tmp_path / 'gpuopt.db'}") as store:
        store.create_all()
        store.prices.record_offers(poll("aws", 0.40))
        kept = weakref.ref(keeper(store))
        latest_table(store)
    del store
    gc.collect()
    assert kept() is None
