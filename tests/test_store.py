"""The store on SQLite and PostgreSQL: prices, latest prices, jobs, events and times."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone
from functools import partial
from pathlib import Path

import pytest
from sqlalchemy import func, select

from optimizer.model import OFFER_FIELDS, Interconnect, Market
from optimizer.store import DuplicateJobError, Store
from optimizer.store.tables import LatestPrice, PriceHistory
from tests.helpers import make_offer as any_offer
from tests.helpers.offers import P4D_24XLARGE

T0 = datetime(2025, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)
TOKYO = timezone(timedelta(hours=9))


# An 8 x A100-40GB node on AWS spot in us-east-1 at $9.8304/h, observed at T0.
make_offer = partial(
    any_offer,
    **P4D_24XLARGE,
    zone="use1-az2",
    market=Market.SPOT,
    usd_per_hour=9.8304,
    observed_at=T0,
    source="aws-api",
)


def count_rows(store: Store, table: type) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(table)).scalar_one())


def test_latest_price_table_holds_every_offer_field(store: Store) -> None:
    # but a commitment's terms: committed offers are not stored (test_committed_offers.py)
    terms = {"term_years", "payment_option", "upfront_usd"}
    assert set(OFFER_FIELDS) - terms <= set(LatestPrice.model_fields)
    assert not terms & set(LatestPrice.model_fields)


def test_offers_round_trip_exactly(store: Store) -> None:
    zonal_spot = make_offer(
        usd_per_hour=0.1 + 0.2,  # 0.30000000000000004: no rounding on the way through
        placement_score=7.5,
        interruption_bucket="<5%",
    )
    regional_on_demand = make_offer(
        provider="gcp",
        region="europe-west4",
        zone=None,
        instance_type="a2-highgpu-1g",
        gpu_count=1,
        vcpus=12,
        ram_gib=85.0,
        interconnect=Interconnect.NONE,
        market=Market.ON_DEMAND,
        usd_per_hour=3.673385,
        observed_at=T0 + timedelta(minutes=5),
        source="snapshot",
    )
    assert store.prices.record_offers([zonal_spot, regional_on_demand]) == 2

    back = store.prices.latest_offers()

    assert set(back) == {zonal_spot, regional_on_demand}
    by_provider = {offer.provider: offer for offer in back}
    assert by_provider["gcp"].zone is None
    assert by_provider["gcp"].market is Market.ON_DEMAND
    assert by_provider["aws"].interconnect is Interconnect.NVLINK
    assert by_provider["aws"].usd_per_hour == 0.30000000000000004


def test_latest_price_keeps_newest_and_ignores_an_older_one_arriving_later(store: Store) -> None:
    newer = make_offer(usd_per_hour=2.0, observed_at=T0 + timedelta(hours=1))
    older = make_offer(usd_per_hour=1.0, observed_at=T0)
    store.prices.record_offers([newer])
    store.prices.record_offers([older])

    assert store.prices.latest_offers() == [newer]
    assert [price for _, price in store.prices.price_history(*newer.pool)] == [1.0, 2.0]

    newest = make_offer(usd_per_hour=3.0, observed_at=T0 + timedelta(hours=2))
    store.prices.record_offers([newest])
    assert store.prices.latest_offers() == [newest]


def test_newest_wins_within_one_batch_whatever_the_order(store: Store) -> None:
    newer = make_offer(usd_per_hour=2.0, observed_at=T0 + timedelta(hours=1))
    older = make_offer(usd_per_hour=1.0, observed_at=T0)
    store.prices.record_offers([newer, older])
    assert store.prices.latest_offers() == [newer]


def test_regional_pool_keeps_one_latest_row(store: Store) -> None:
    first = make_offer(zone=None, market=Market.ON_DEMAND, observed_at=T0)
    second = replace(first, usd_per_hour=10.5, observed_at=T0 + timedelta(hours=1))
    store.prices.record_offers([first])
    store.prices.record_offers([second])

    assert store.prices.latest_offers() == [second]
    assert count_rows(store, LatestPrice) == 1


def test_cheapest_offers_pages_through_every_offer_once_cheapest_first(store: Store) -> None:
    # 25 pools, prices with ties (five pools per price), so the order needs its tiebreak.
    offers = [
        make_offer(zone=f"use1-az{n % 5}", instance_type=f"p{n // 5}.x", usd_per_hour=n % 5 + 1.0)
        for n in range(25)
    ]
    offers.append(make_offer(zone=None, market=Market.ON_DEMAND, usd_per_hour=0.5))
    store.prices.record_offers(offers)
    pages = [store.prices.cheapest_offers(limit=10, offset=start) for start in (0, 10, 20, 30)]
    assert [count for count, _ in pages] == [26, 26, 26, 26]
    assert [len(rows) for _, rows in pages] == [10, 10, 6, 0]
    seen = [o for _, rows in pages for o in rows]
    assert Counter(o.pool for o in seen) == Counter(o.pool for o in offers)  # each once
    assert [o.usd_per_hour for o in seen] == sorted(o.usd_per_hour for o in offers)
    tied = [o.pool for o in seen if o.usd_per_hour == 1.0]
    assert tied == sorted(tied)  # equal prices in pool order
    assert store.prices.cheapest_offers(market="on_demand") == (1, [offers[-1]])
    assert store.prices.cheapest_offers(region="eu-west-1") == (0, [])


def test_latest_offers_filters_by_provider_region_and_market(store: Store) -> None:
    aws_spot = make_offer()
    aws_on_demand = make_offer(zone=None, market=Market.ON_DEMAND)
    aws_west = make_offer(region="us-west-2", zone="usw2-az1")
    gcp = make_offer(provider="gcp", region="us-central1", zone="us-central1-a")
    store.prices.record_offers([aws_spot, aws_on_demand, aws_west, gcp])

    assert set(store.prices.latest_offers(provider="aws")) == {aws_spot, aws_on_demand, aws_west}
    assert store.prices.latest_offers(provider="aws", region="us-east-1", market="spot") == [
        aws_spot
    ]
    assert store.prices.latest_offers(market=Market.ON_DEMAND) == [aws_on_demand]
    assert store.prices.latest_offers(provider="azure") == []


def test_price_history_is_time_ordered_and_filtered_half_open(store: Store) -> None:
    times = [T0 + timedelta(hours=h) for h in (3, 0, 2, 1)]
    store.prices.record_offers(
        make_offer(observed_at=t, usd_per_hour=float(i)) for i, t in enumerate(times)
    )
    store.prices.record_offers(
        [make_offer(zone="use1-az4", observed_at=T0 + timedelta(minutes=30))]
    )
    pool = make_offer().pool

    assert store.prices.price_history(*pool) == [
        (T0, 1.0),
        (T0 + timedelta(hours=1), 3.0),
        (T0 + timedelta(hours=2), 2.0),
        (T0 + timedelta(hours=3), 0.0),
    ]
    window = store.prices.price_history(
        *pool, since=T0 + timedelta(hours=1), until=T0 + timedelta(hours=3)
    )
    assert window == [(T0 + timedelta(hours=1), 3.0), (T0 + timedelta(hours=2), 2.0)]
    assert store.prices.price_history("aws", "us-east-1", "use1-az9", "p4d.24xlarge", "spot") == []


def test_price_history_of_a_regional_pool_matches_zone_none(store: Store) -> None:
    offer = make_offer(zone=None, market=Market.ON_DEMAND)
    store.prices.record_offers([offer])
    assert store.prices.price_history(*offer.pool) == [(T0, offer.usd_per_hour)]


def test_batch_of_10000_rows_lands_completely(store: Store) -> None:
    zones = [f"use1-az{n}" for n in range(1, 6)]
    types = [f"g5.{size}xlarge" for size in (1, 2, 4, 8, 12, 16, 24, 48)]
    offers = [
        make_offer(
            zone=zones[i % 5],
            instance_type=types[(i // 5) % 8],
            market=Market.SPOT if (i // 40) % 2 else Market.ON_DEMAND,
            usd_per_hour=1.0 + (i % 97) / 100,
            observed_at=T0 + timedelta(seconds=i),
        )
        for i in range(10_000)
    ]

    assert store.prices.record_offers(iter(offers)) == 10_000

    assert count_rows(store, PriceHistory) == 10_000
    pools = {offer.pool for offer in offers}
    assert count_rows(store, LatestPrice) == len(pools) == 80
    newest = {}
    for offer in offers:
        newest[offer.pool] = offer  # times rise with i, so the last one per pool is newest
    assert set(store.prices.latest_offers()) == set(newest.values())


def test_recording_nothing_writes_nothing(store: Store) -> None:
    assert store.prices.record_offers([]) == 0
    assert store.prices.latest_offers() == []


def test_duplicate_job_name_is_refused_and_names_the_job(store: Store) -> None:
    job_id = store.jobs.add_job("llama-finetune", "cheap-a100", {"command": ["train.py"]}, at=T0)

    with pytest.raises(DuplicateJobError, match="llama-finetune") as caught:
        store.jobs.add_job("llama-finetune", "other-policy", {}, at=T0)

    assert caught.value.name == "llama-finetune"
    job = store.jobs.get_job("llama-finetune")
    assert job is not None
    assert (job.id, job.policy, job.spec) == (job_id, "cheap-a100", {"command": ["train.py"]})
    assert (job.state, job.reason, job.restarts) == ("pending", None, 0)
    assert [j.name for j in store.jobs.list_jobs()] == ["llama-finetune"]


def test_get_job_of_unknown_name_is_none(store: Store) -> None:
    assert store.jobs.get_job("nope") is None


def test_events_come_back_oldest_first_newest_limit_and_per_job(store: Store) -> None:
    job_id = store.jobs.add_job("j", "p", {}, at=T0)
    store.events.add_event("launch", "first", job_id=job_id, at=T0 + timedelta(minutes=1))
    store.events.add_event(
        "preempted",
        "second",
        severity="warning",
        job_id=job_id,
        policy="p",
        data={"zone": "use1-az2", "price": 1.5},
        at=T0 + timedelta(minutes=2),
    )
    store.events.add_event("poll", "third", at=T0 + timedelta(minutes=3))

    assert [e.message for e in store.events.recent()] == ["first", "second", "third"]
    assert [e.message for e in store.events.recent(limit=2)] == ["second", "third"]
    second = store.events.recent(job_id=job_id)[-1]
    assert (second.kind, second.severity, second.policy) == ("preempted", "warning", "p")
    assert second.data == {"zone": "use1-az2", "price": 1.5}
    assert second.at == T0 + timedelta(minutes=2)
    assert [e.message for e in store.events.recent(job_id=job_id)] == ["first", "second"]


def test_times_come_back_as_utc(store: Store) -> None:
    tokyo_time = datetime(2025, 3, 2, 9, 30, tzinfo=TOKYO)
    store.prices.record_offers([make_offer(observed_at=tokyo_time)])
    store.jobs.add_job("j", "p", {}, at=tokyo_time)
    store.events.add_event("note", "m", at=tokyo_time)

    stamps = [
        store.prices.latest_offers()[0].observed_at,
        store.prices.price_history(*make_offer().pool)[0][0],
        store.jobs.get_job("j").created_at,  # type: ignore[union-attr]
        store.events.recent()[0].at,
    ]
    for stamp in stamps:
        assert stamp.tzinfo is UTC
        assert stamp == datetime(2025, 3, 2, 0, 30, tzinfo=UTC)


def test_times_default_to_the_injected_clock(tmp_path: Path) -> None:
    with Store(f"sqlite:///{tmp_path / 'c.db'}", clock=lambda: T0) as db:
        db.create_all()
        db.jobs.add_job("j", "p", {})
        db.events.add_event("note", "m")
        assert db.jobs.get_job("j").created_at == T0  # type: ignore[union-attr]
        assert db.events.recent()[0].at == T0


def test_naive_times_are_refused(store: Store) -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        store.events.add_event("note", "m", at=datetime(2025, 1, 1))
    with pytest.raises(ValueError, match="timezone-aware"):
        store.prices.price_history(*make_offer().pool, since=datetime(2025, 1, 1))


def test_schema_is_refused_on_sqlite(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="PostgreSQL only"):
        Store(f"sqlite:///{tmp_path / 'x.db'}", schema="s")


def test_spec_cache_round_trip_and_replace(store: Store) -> None:
    assert store.prices.load_cached("aws", "us-east-1/instance-types") is None
    first = {"p4d.24xlarge": {"gpus": 8, "memory_mib": 40960}}
    store.prices.save_cached("aws", "us-east-1/instance-types", first, T0)
    assert store.prices.load_cached("aws", "us-east-1/instance-types") == (T0, first)
    later = T0 + timedelta(days=1)
    store.prices.save_cached("aws", "us-east-1/instance-types", {"g5.xlarge": {"gpus": 1}}, later)
    assert store.prices.load_cached("aws", "us-east-1/instance-types") == (
        later,
        {"g5.xlarge": {"gpus": 1}},
    )
    assert store.prices.load_cached("gcp", "us-east-1/instance-types") is None
