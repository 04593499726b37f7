"""The catalog CSV exchange format: round trips and located errors."""

from __future__ import annotations

import io
from datetime import UTC, datetime
from functools import partial

import pytest
from hypothesis import given
from hypothesis import strategies as st

from optimizer.catalog import CatalogError, parse_catalog, read_catalog, write_catalog
from optimizer.model import OFFER_FIELDS, Market, Offer
from tests.helpers import make_offer
from tests.helpers.offers import P4DE_24XLARGE

T0 = datetime(2026, 4, 23, 12, 30, tzinfo=UTC)


# An 8 x A100-80GB node on AWS spot in Ireland, every optional field set.
offer = partial(
    make_offer,
    **P4DE_24XLARGE,
    region="eu-west-1",
    zone="euw1-az1",
    market=Market.SPOT,
    usd_per_hour=12.3456,
    observed_at=T0,
    placement_score=7.0,
    interruption_bucket="<5%",
    source="aws-api",
)


def dump(offers: list[Offer], comments: tuple[str, ...] = ()) -> str:
    out = io.StringIO()
    write_catalog(offers, out, comments=comments)
    return out.getvalue()


def test_round_trip_keeps_every_field() -> None:
    rows = [
        offer(),
        offer(
            zone=None,
            market=Market.ON_DEMAND,
            placement_score=None,
            interruption_bucket=None,
            usd_per_hour=40.96,
        ),
    ]
    assert parse_catalog(dump(rows, comments=("list prices", "as of 2026-04-23"))) == rows


def test_header_is_one_column_per_offer_field() -> None:
    assert dump([]).strip() == ",".join(OFFER_FIELDS)


@given(
    price=st.floats(min_value=0, max_value=1e6, allow_nan=False, allow_infinity=False),
    memory=st.floats(min_value=0, max_value=4096, allow_nan=False, allow_infinity=False),
    count=st.integers(min_value=0, max_value=64),
    zone=st.one_of(st.none(), st.from_regex(r"[a-z0-9-]{1,20}", fullmatch=True)),
)
def test_round_trip_is_exact_for_any_numbers(
    price: float, memory: float, count: int, zone: str | None
) -> None:
    row = offer(usd_per_hour=price, gpu_memory_gib=memory, gpu_count=count, zone=zone)
    assert parse_catalog(dump([row])) == [row]


def bad_value_error(field: str, value: str) -> CatalogError:
    text = dump([offer(), offer()], comments=("a comment",))
    lines = text.splitlines()
    header = lines[1].split(",")
    cells = lines[3].split(",")
    cells[header.index(field)] = value
    lines[3] = ",".join(cells)
    with pytest.raises(CatalogError) as caught:
        parse_catalog("\n".join(lines) + "\n", path="prices.csv")
    return caught.value


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [
        ("usd_per_hour", "cheap", "could not convert"),
        ("usd_per_hour", "-1", ">= 0"),
        ("usd_per_hour", "nan", "finite"),
        ("gpu_count", "2.5", "whole number"),
        ("market", "reserved", "not one of: spot, on_demand"),
        ("interconnect", "carrier-pigeon", "not one of"),
        ("observed_at", "2026-04-23T00:00:00", "no UTC offset"),
        ("observed_at", "yesterday", "Invalid isoformat"),
        ("provider", "", "missing value"),
        ("placement_score", "11", "within 0..10"),
    ],
)
def test_bad_value_names_file_line_column_and_field(field: str, value: str, needle: str) -> None:
    error = bad_value_error(field, value)
    assert error.line == 4  # the comment, the header, one good row, then the bad one
    assert error.column == OFFER_FIELDS.index(field) + 1
    assert error.field == field
    assert needle in str(error)
    assert str(error).startswith(f"prices.csv:4:{error.column}: {field}: ")


def test_missing_required_column_is_named() -> None:
    text = dump([offer()]).replace("usd_per_hour", "price")
    with pytest.raises(
        CatalogError,
        match=r"x.csv:1: header lacks required column\(s\): "
        r"usd_per_hour",
    ):
        parse_catalog(text, path="x.csv")


def test_wrong_number_of_values_names_the_line() -> None:
    text = dump([offer()]) + "aws,eu-west-1\n"
    with pytest.raises(CatalogError, match=r"^x.csv:3: expected 21 values, found 2$"):
        parse_catalog(text, path="x.csv")


def test_unterminated_quote_is_a_located_error() -> None:
    text = dump([offer()]) + 'aws,"eu-west-1\n'
    with pytest.raises(CatalogError, match=r"^x\.csv:3"):
        parse_catalog(text, path="x.csv")


def test_empty_file_and_missing_file(tmp_path) -> None:
    empty = tmp_path / "empty.csv"
    empty.write_text("# only a comment\n")
    with pytest.raises(CatalogError, match="empty file"):
        read_catalog(empty)
    with pytest.raises(CatalogError, match="no such file"):
        read_catalog(tmp_path / "nope.csv")
    with pytest.raises(CatalogError, match="is a directory"):
        read_catalog(tmp_path)


def test_binary_file_is_refused(tmp_path) -> None:
    blob = tmp_path / "blob.csv"
    blob.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(CatalogError, match="not UTF-8"):
        read_catalog(blob)


def test_optional_columns_may_be_left_out() -> None:
    required = [
        f
        for f in OFFER_FIELDS
        if f
        not in (
            "zone",
            "placement_score",
            "interruption_bucket",
            "source",
            "term_years",
            "payment_option",
            "upfront_usd",
        )
    ]
    row = offer(zone=None, placement_score=None, interruption_bucket=None, source="")
    values = row.to_dict()
    text = ",".join(required) + "\n" + ",".join(str(values[f]) for f in required) + "\n"
    assert parse_catalog(text) == [row]
