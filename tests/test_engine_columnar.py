"""The columnar engine against the row engine it replaced (tests/helpers/row_engine.py).

For random policies, offers and probe measurements, both must give the same candidates (every
figure) in the same order, and the same rule and reason for every rejection, in the same
order; and each rule's mask must agree with its own words on every offer it judges.
Hypothesis runs a bounded number of examples (GPUOPT_PROPERTY_EXAMPLES, default 60) so
the suite stays fast; raise it locally to search harder.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from typing import Any
from unittest.mock import patch

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from optimizer.model import Fabric, Interconnect, Market, Offer, PaymentOption
from policies import table as table_module
from policies.budget import Committed
from policies.columnar import PASSED, judge, places
from policies.egress import StatePlace
from policies.engine import OfferTable, Ranking, evaluate
from policies.measured import Measured, TypeMeasurement
from policies.price_rules import STALE
from policies.rule import Priced, PriceRule, Prices, Shape, ShapeColumns
from policies.rules import RuleSet
from policies.schema import Policy
from policies.table import SHAPE_FIELDS
from providers import registry
from tests.helpers import row_engine

NOW = datetime(2026, 4, 23, 12, tzinfo=UTC)
EXAMPLES = int(os.environ.get("GPUOPT_PROPERTY_EXAMPLES", "60"))

REGIONS = {  # a few of each built-in provider's regions, for the region globs and presets
    "aws": ["us-east-1", "eu-west-1", "eu-central-1", "eu-south-1", "ap-northeast-1"],
    "gcp": ["us-central1", "europe-west4", "europe-west1", "asia-east1"],
    "local": ["us-east-1", "europe-west4"],  # the local cloud borrows their names
}
PLACES = {name: REGIONS.get(name, [f"{name}-1"]) for name in registry.names()}
"""Every installed provider (the registry's), with regions to sample."""
TYPES = ["p4d.24xlarge", "g5.xlarge", "a3-highgpu-8g", "g2-standard-8", "tiny"]
MODELS = ["A100-80GB", "H100-80GB", "L4", "T4", "A10G", "MI300X", "unknown:Mystery"]
PRICES = [0.5, 1.0, 2.5, 4.0, 12.0, 13.926624, 30.0, 41.2]  # few values: ties happen


@st.composite
def offers(draw: st.DrawFn) -> Offer:
    provider = draw(st.sampled_from(sorted(PLACES)))
    region = draw(st.sampled_from(PLACES[provider]))
    count = draw(st.sampled_from([0, 1, 2, 4, 8]))
    market = draw(st.sampled_from(list(Market)))
    # a commitment carries its term and payment option (no upfront: any price is valid)
    terms: dict[str, Any] = {}
    if market is Market.COMMITTED:
        terms = {
            "term_years": draw(st.sampled_from([1, 3])),
            "payment_option": draw(st.sampled_from(list(PaymentOption))),
            "upfront_usd": 0.0,
        }
    return Offer(
        provider=provider,
        region=region,
        zone=draw(st.sampled_from([None, f"{region}-a", f"{region}-b"])),
        instance_type=draw(st.sampled_from(TYPES)),
        gpu_model=draw(st.sampled_from(MODELS)),
        gpu_count=count,
        gpu_memory_gib=draw(st.sampled_from([16.0, 24.0, 40.0, 80.0, 96.0])),
        vcpus=draw(st.sampled_from([4, 32, 96, 192])),
        ram_gib=draw(st.sampled_from([16.0, 256.0, 1152.0, 2048.0])),
        interconnect=draw(st.sampled_from(list(Interconnect))),
        market=market,
        usd_per_hour=draw(st.sampled_from(PRICES)),
        observed_at=NOW + timedelta(minutes=draw(st.sampled_from([-900, -120, -30, 0, 3, 60]))),
        placement_score=draw(st.sampled_from([None, 1.0, 9.0])),
        interruption_bucket=draw(st.sampled_from([None, "<5%", "5-10%"])),
        source=draw(st.sampled_from(["", "aws-api", "simulated"])),
        fabric=draw(st.sampled_from(list(Fabric))),
        fabric_interfaces=draw(st.sampled_from([0, 4])),
        **terms,
    )


def _maybe(draw: st.DrawFn, strategy: st.SearchStrategy[Any]) -> Any:
    return draw(st.one_of(st.none(), strategy))


@st.composite
def policies(draw: st.DrawFn) -> Policy:
    workload: dict[str, Any] = {
        "gpus": draw(st.sampled_from([1, 2, 4, 8])),
        "fp64": draw(st.booleans()),
        "interconnect": draw(st.sampled_from(["any", "nvlink"])),
        "gpu_models": draw(st.lists(st.sampled_from(MODELS[:-1]), max_size=3, unique=True)),
        "cpu_memory_gib": draw(st.sampled_from([0, 64, 1024])),
        "vcpus": draw(st.sampled_from([0, 8, 128])),
        "fabric": draw(st.sampled_from(["any", "fast", "efa", "gpudirect-tcpx"])),
    }
    memory = _maybe(draw, st.sampled_from([10, 20, 66.67, 70]))
    if memory is not None:
        workload["gpu_memory_gib"] = memory
    tflops = draw(
        st.dictionaries(
            st.sampled_from(["bf16", "fp32", "fp64", "fp8"]),
            st.sampled_from([10, 100, 1500]),
            max_size=2,
        )
    )
    if tflops:
        workload["min_tflops"] = tflops
    bid = {
        "max_usd_per_hour": _maybe(draw, st.sampled_from([2.5, 13.0, 30.0])),
        "max_usd_per_gpu_hour": _maybe(draw, st.sampled_from([0.5, 3.5])),
        "max_fraction_of_on_demand": _maybe(draw, st.sampled_from([0.25, 0.5, 1.0])),
    }
    body: dict[str, Any] = {
        "apiVersion": "gpuopt/v1",
        "kind": "Policy",
        "name": "prop",
        "workload": workload,
        "buffer": draw(st.sampled_from([0.0, 0.2])),
        "markets": draw(
            st.sampled_from(
                [
                    ["spot"],
                    ["on_demand"],
                    ["spot", "on_demand"],
                    ["on_demand", "spot"],
                    ["committed", "spot"],
                    ["on_demand", "committed"],
                ]
            )
        ),
        "rank_by": draw(st.sampled_from(["price", "price_per_tflop", "price_per_tbps"])),
        "bid": {k: v for k, v in bid.items() if v is not None},
        "placement": {
            "providers": draw(st.lists(st.sampled_from(sorted(PLACES)), min_size=1, unique=True)),
            "regions": {
                "allow": draw(
                    st.sampled_from([["*"], ["eu-*", "europe-*"], ["us-*", "asia-east1"]])
                ),
                "deny": draw(st.sampled_from([[], ["eu-south-*"], ["*-east*"]])),
            },
            "compliance": draw(st.sampled_from([None, "eu", "us"])),
        },
        "budget": {"monthly_usd": _maybe(draw, st.sampled_from([500, 14000]))},
        "data": {
            "max_move_usd": _maybe(draw, st.sampled_from([0.0, 0.5, 1.0, 2.0, 5.0, 25.0])),
            "regions": {"allow": draw(st.sampled_from([["*"], ["eu-*", "europe-*"], ["us-*"]]))},
        },
    }
    age = _maybe(draw, st.sampled_from([1, 6]))
    if age is not None:
        body["max_price_age_hours"] = age
    return Policy.model_validate(body)


@st.composite
def measurements(draw: st.DrawFn) -> Measured | None:
    if draw(st.booleans()):
        return None
    kinds = st.tuples(st.sampled_from(sorted(PLACES)), st.sampled_from(TYPES))
    types = draw(
        st.dictionaries(
            kinds,
            st.builds(
                TypeMeasurement,
                tflops=st.dictionaries(
                    st.sampled_from(["bf16", "fp64"]), st.sampled_from([0.0, 50.0, 400.0])
                ),
                copy_gbps=st.sampled_from([None, 0.0, 1500.0]),
                n=st.integers(1, 9),
                newest_at=st.just(NOW - timedelta(hours=2)),
            ),
            max_size=3,
        )
    )
    models = draw(
        st.dictionaries(st.sampled_from(MODELS[:-1]), st.just({"bf16": 120.0}), max_size=2)
    )
    demoted = draw(st.dictionaries(kinds, st.just("3 failed probes"), max_size=2))
    return Measured(types=types, models=models, demoted=demoted)


@st.composite
def states(draw: st.DrawFn) -> StatePlace | None:
    """Where a job's state is, or None (most rankings have none)."""
    if draw(st.booleans()):
        return None
    provider = draw(st.sampled_from(sorted(PLACES)))
    return StatePlace(
        provider,
        draw(st.sampled_from(PLACES[provider])),
        draw(st.sampled_from([0, 10**9, 13_200_000_000, 5 * 10**11])),
        draw(st.sampled_from([None, 100.0, 1200.0])),
        draw(st.sampled_from([1.0, 24.0, 200.0])),
    )


def _same(ours: Ranking, oracle: Ranking) -> None:
    assert len(ours.candidates) == len(oracle.candidates)
    assert list(ours.candidates) == list(oracle.candidates)
    assert ours.rejection_counts() == oracle.rejection_counts()
    assert [(r.offer, r.rule, r.reason) for r in ours.rejections] == [
        (r.offer, r.rule, r.reason) for r in oracle.rejections
    ]
    assert ours.to_dict() == oracle.to_dict()


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    policy=policies(),
    rows=st.lists(offers(), max_size=40),
    copies=st.integers(1, 3),
    measured=measurements(),
    spent=st.sampled_from([None, Committed(300.0, 0.5, 1)]),
    state=states(),
)
def test_columnar_engine_matches_the_row_engine(
    policy: Policy,
    rows: list[Offer],
    copies: int,
    measured: Measured | None,
    spent: Committed | None,
    state: StatePlace | None,
) -> None:
    listed = rows * copies  # repeated rows: equal scores and shapes across the list
    given = {"measured": measured, "committed": spent, "state": state}
    oracle = row_engine.evaluate(policy, listed, NOW, **given)  # type: ignore[arg-type]
    ours = evaluate(policy, OfferTable.from_offers(listed), NOW, **given)  # type: ignore[arg-type]
    _same(ours, oracle)
    again = evaluate(policy, listed, NOW, **given)  # type: ignore[arg-type]  # plain offers
    assert list(again.candidates) == list(oracle.candidates)


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(rows=st.lists(offers(), max_size=40), copies=st.integers(1, 3))
def test_a_tables_columns_and_shapes_read_back_every_offer(rows: list[Offer], copies: int) -> None:
    """The build encodes each row's shape at once (policies/table.py): every column still
    reads back each offer's own value, and two rows share a shape id exactly where their
    shape fields agree, the shape's first row being the first such row."""
    listed = rows * copies
    table = OfferTable.from_offers(listed)
    for name, spec in Offer.__dataclass_fields__.items():
        if spec.type in ("int", "float"):
            got = table.number(name).tolist()
        else:
            column = table.column(name)
            got = [column.values[c] for c in column.codes.tolist()]
        assert got == [getattr(o, name) for o in listed], name
    ids, first = table.shape_ids()
    seen: dict[tuple[Any, ...], int] = {}
    for row, offer in enumerate(listed):
        shape = tuple(getattr(offer, f) for f in SHAPE_FIELDS)
        start = seen.setdefault(shape, row)
        assert ids[row] == ids[start] and first[ids[row]] == start
    assert len(first) == len(seen)


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    policy=policies(),
    rows=st.lists(offers(), max_size=40),
    copies=st.integers(1, 3),
    measured=measurements(),
    data=st.data(),
)
def test_a_tables_subset_ranks_as_a_table_built_from_those_offers(
    policy: Policy, rows: list[Offer], copies: int, measured: Measured | None, data: st.DataObject
) -> None:
    """`OfferTable.take` (a launch's ranking less its cooled pools) reuses the columns,
    shapes and ranks of the kept table; it must rank as a table built afresh."""
    listed = rows * copies
    table = OfferTable.from_offers(listed)
    evaluate(policy, table, NOW, measured=measured)  # its memos built, as a kept table's are
    keep = sorted(data.draw(st.sets(st.integers(0, len(listed) - 1))) if listed else set())
    subset = table.take(np.array(keep, dtype=np.int64))
    fresh = OfferTable.from_offers([listed[i] for i in keep])
    _same(
        evaluate(policy, subset, NOW, measured=measured),
        evaluate(policy, fresh, NOW, measured=measured),
    )


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    policy=policies(),
    rows=st.lists(offers(), min_size=1, max_size=40),
    measured=measurements(),
    spent=st.sampled_from([None, Committed(300.0, 0.5, 1)]),
    state=states(),
)
def test_each_rules_mask_agrees_with_its_words_on_every_offer(
    policy: Policy,
    rows: list[Offer],
    measured: Measured | None,
    spent: Committed | None,
    state: StatePlace | None,
) -> None:
    """Rule by rule, not only the first failing one: where a rule's mask is True its `why`
    gives a reason, and nowhere else (policies/rule.py), so a rule checked later than another
    that rejects an offer is held to its words too."""
    rules = RuleSet(policy, NOW, measured, committed=spent, state=state)
    table = OfferTable.from_offers(rows)
    offers_ = table.offers
    assert STALE.mask(rules, table).tolist() == [
        STALE.why(rules, o.observed_at) is not None for o in offers_
    ]
    columns = ShapeColumns(rules, table)
    first = [offers_[i] for i in columns.rows.tolist()]
    for _, rule in rules.shape_checks:
        words = [rule.why(rules, Shape._make(getattr(o, f) for f in SHAPE_FIELDS)) for o in first]
        assert rule.mask(rules, columns).tolist() == [w is not None for w in words], rule.id
    # The price rules judge the offers that pass stale and every shape rule.
    verdicts = judge(rules, table)
    priced = [r == PASSED or isinstance(rules.checks[r], PriceRule) for r in verdicts.rule]
    pending = np.flatnonzero(priced)
    on_demand = verdicts.on_demand[pending]
    prices = Prices(
        table.number("usd_per_hour")[pending],
        table.number("gpu_count")[pending],
        np.array([offers_[i].market is Market.SPOT for i in pending.tolist()], dtype=bool),
        on_demand,
        lambda: rules.budget_hours,
        lambda: places(table, pending),
    )
    for _, rule in rules.price_checks:
        words = [
            rule.why(
                rules,
                Priced(
                    o.usd_per_hour,
                    o.gpu_count,
                    o.market,
                    None if np.isnan(od) else float(od),
                    o.instance_type,
                    o.region,
                    o.provider,
                ),
            )
            for o, od in zip(
                [offers_[i] for i in pending.tolist()], on_demand.tolist(), strict=True
            )
        ]
        assert rule.mask(rules, prices).tolist() == [w is not None for w in words], rule.id


def test_one_table_ranks_many_policies_alike() -> None:
    """A table built once gives each policy the answer a fresh table would."""
    listed = [
        Offer(
            "aws",
            "eu-west-1",
            z,
            "p4d.24xlarge",
            "A100-40GB",
            8,
            40.0,
            96,
            1152.0,
            Interconnect.NVLINK,
            m,
            p,
            NOW,
            source="aws-api",
        )
        for z in ("euw1-az1", "euw1-az2")
        for m, p in ((Market.SPOT, 9.0), (Market.ON_DEMAND, 32.77))
    ]
    table = OfferTable.from_offers(listed)
    cheap = Policy.model_validate(
        {
            "apiVersion": "gpuopt/v1",
            "kind": "Policy",
            "name": "cheap",
            "bid": {"max_fraction_of_on_demand": 0.25},
        }
    )
    spot = Policy.model_validate(
        {"apiVersion": "gpuopt/v1", "kind": "Policy", "name": "spot", "markets": ["spot"]}
    )
    for policy in (cheap, spot, cheap):
        _same(evaluate(policy, table, NOW), row_engine.evaluate(policy, listed, NOW))
    ranked = evaluate(cheap, table, NOW)
    assert [c.offer.zone for c in ranked.candidates] == ["euw1-az1", "euw1-az2"]
    assert ranked.rejected("bid.max_fraction_of_on_demand")[0].reason == (
        "spot $9/h is 0.275 of on-demand $32.77/h > 0.25"
    )


def test_empty_offers_rank_to_nothing() -> None:
    policy = Policy.model_validate({"apiVersion": "gpuopt/v1", "kind": "Policy", "name": "p"})
    ranked = evaluate(policy, [], NOW)
    assert ranked.best is None and ranked.rejections == () and ranked.rejection_counts() == {}


TEXT_FIELDS = [n for n, f in Offer.__dataclass_fields__.items() if f.type in ("str", "str | None")]


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(offers(), max_size=40))
def test_text_columns_encode_alike_by_dict_and_by_arrow(listed: list[Offer]) -> None:
    """A text column shorter than ARROW_FROM_ROWS is encoded by a dict (no pyarrow), a longer
    one by Arrow: the same codes and values either way."""

    def columns(arrow_from: int) -> dict[str, tuple[list[int], tuple[Any, ...]]]:
        with patch.object(table_module, "ARROW_FROM_ROWS", arrow_from):
            table = OfferTable.from_offers(listed)
            found = {name: table.column(name) for name in TEXT_FIELDS}
        return {name: (c.codes.tolist(), c.values) for name, c in found.items()}

    assert columns(0) == columns(1 << 30)
