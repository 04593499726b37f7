"""How an `OfferTable` is built from offers: each offer's packed row (its shape's number, time
and price, made with the offer) gives the columns, and the table answers as one built from
the offers' fields would (policies/table.py, optimizer/model.py)."""

from __future__ import annotations

import copy
import pickle
from datetime import timedelta

import numpy as np
import pytest

from optimizer import model
from optimizer.model import Market, Offer
from policies.engine import evaluate
from policies.schema import Policy
from policies.table import SHAPE_FIELDS, OfferTable
from tests.helpers import make_offer
from tests.helpers.offers import T0

NOW = T0 + timedelta(minutes=5)
ANY = Policy.model_validate(
    {"apiVersion": "gpuopt/v1", "kind": "Policy", "name": "any", "max_price_age_hours": 6}
)
PICKY = Policy.model_validate(
    {
        "apiVersion": "gpuopt/v1",
        "kind": "Policy",
        "name": "picky",
        "workload": {"gpus": 8},
        "markets": ["spot"],
        "bid": {"max_usd_per_hour": 30},
        "max_price_age_hours": 1,
    }
)


def offers() -> list[Offer]:
    """Shapes repeated across zones and times, one stale time, one 8-GPU shape."""
    out = []
    for i in range(12):
        out.append(
            make_offer(
                zone=f"us-east-1{'abc'[i % 3]}",
                market=(Market.SPOT, Market.ON_DEMAND)[i % 2],
                usd_per_hour=10.0 + i,
                observed_at=T0 - timedelta(hours=2 * (i % 4 == 3)),
            )
        )
    out.append(make_offer(gpu_count=8, usd_per_hour=3.0, observed_at=T0))
    return out


def field_table(rows: list[Offer]) -> tuple[list[tuple[object, ...]], list[object]]:
    """What the table's shape ids and times must group: each row's shape and time."""
    return [tuple(getattr(o, f) for f in SHAPE_FIELDS) for o in rows], [o.observed_at for o in rows]


def assert_grouped_as_fields(table: OfferTable, rows: list[Offer]) -> None:
    shapes, times = field_table(rows)
    ids, first = table.shape_ids()
    distinct = list(dict.fromkeys(shapes))
    assert ids.tolist() == [distinct.index(s) for s in shapes]
    assert first.tolist() == [shapes.index(s) for s in distinct]
    column = table.column("observed_at")
    assert [column.values[c] for c in column.codes.tolist()] == times
    assert list(column.values) == list(dict.fromkeys(times))
    assert table.number("usd_per_hour").tolist() == [o.usd_per_hour for o in rows]
    for name in SHAPE_FIELDS:
        if str(Offer.__dataclass_fields__[name].type) in ("int", "float"):
            assert table.number(name).tolist() == [getattr(o, name) for o in rows]
        else:
            found = table.column(name)
            assert [found.values[c] for c in found.codes.tolist()] == [
                getattr(o, name) for o in rows
            ]


def test_offers_of_one_shape_share_a_number_and_others_do_not() -> None:
    a, b = make_offer(usd_per_hour=1.0), make_offer(usd_per_hour=2.0, zone="elsewhere")
    c = make_offer(gpu_count=4)
    number = model.ROW_FORMAT.unpack
    assert number(a._row)[0] == number(b._row)[0] != number(c._row)[0]


def test_the_table_groups_rows_as_their_fields_do() -> None:
    rows = offers()
    assert_grouped_as_fields(OfferTable.from_offers(rows), rows)


def test_a_copied_or_unpickled_offer_has_its_row_and_ranks_the_same() -> None:
    rows = offers()
    again = [pickle.loads(pickle.dumps(o)) for o in rows[:6]] + [copy.copy(o) for o in rows[6:]]
    assert again == rows
    assert [o._row for o in again] == [o._row for o in rows]
    first, second = evaluate(PICKY, rows, NOW), evaluate(PICKY, again, NOW)
    assert list(first.candidates) == list(second.candidates)
    assert first.rejections == second.rejections


def test_two_numbers_for_one_shape_still_make_one_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    # The map of shape numbers is emptied when it grows too big: offers made after that get
    # a new number for a shape older offers have. The table still sees one shape.
    before = offers()
    monkeypatch.setattr(model, "_SHAPES", {})
    after = [make_offer(**{f: getattr(o, f) for f in model.OFFER_FIELDS}) for o in before]
    numbers = {model.ROW_FORMAT.unpack(o._row)[0] for o in before + after}
    assert len(numbers) == 2 * len({tuple(getattr(o, f) for f in SHAPE_FIELDS) for o in before})
    mixed = [o for pair in zip(before, after, strict=True) for o in pair]
    table = OfferTable.from_offers(mixed)
    assert_grouped_as_fields(table, mixed)
    by_fields = evaluate(PICKY, OfferTable.from_offers(mixed), NOW)
    assert list(by_fields.candidates) == list(evaluate(PICKY, before + after, NOW).candidates)


@pytest.mark.parametrize("policy", [ANY, PICKY], ids=lambda p: p.name)
def test_a_taken_table_ranks_as_one_built_from_its_offers(policy: Policy) -> None:
    rows = offers()
    picked = np.array([0, 2, 3, 7, 12])
    taken = OfferTable.from_offers(rows).take(picked)
    built = OfferTable.from_offers([rows[i] for i in picked])
    first, second = evaluate(policy, taken, NOW), evaluate(policy, built, NOW)
    assert list(first.candidates) == list(second.candidates)
    assert first.rejections == second.rejections
    assert taken.shape_ids()[0].tolist() == built.shape_ids()[0].tolist()


def test_an_empty_table() -> None:
    table = OfferTable.from_offers([])
    assert len(table) == 0
    assert table.shape_ids()[0].tolist() == []
    assert evaluate(ANY, table, NOW).candidates == ()


def test_a_list_of_offers_is_read_in_place_and_an_iterator_is_kept_whole() -> None:
    rows = offers()
    assert OfferTable.from_offers(rows).offers is rows  # no copy of every offer
    assert OfferTable.from_offers(iter(rows)).offers == tuple(rows)
