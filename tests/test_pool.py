"""The capacity pool, one value type (`optimizer.model.Pool`) with one text form: what events,
the price state and the console carry stays the text they carried before it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from optimizer.daemon.prices import pool_key
from optimizer.jobs import machine, windows
from optimizer.jobs.ranking import pool_of
from optimizer.model import Market, Pool
from tests.helpers import make_offer

ROOT = Path(__file__).resolve().parents[1]
ZONAL = Pool("aws", "eu-west-1", "euw1-az1", "p4d.24xlarge", "spot")
REGIONAL = Pool("aws", "eu-west-1", None, "p4d.24xlarge", "on_demand")


def test_a_pool_is_the_tuple_it_replaces() -> None:
    plain = ("aws", "eu-west-1", "euw1-az1", "p4d.24xlarge", "spot")
    assert plain == ZONAL and hash(ZONAL) == hash(plain) and plain in {ZONAL}
    provider, region, zone, kind, market = ZONAL
    assert (provider, region, zone, kind, market) == plain
    assert ZONAL._replace(zone=None) == ("aws", "eu-west-1", None, "p4d.24xlarge", "spot")


def test_its_text_form_reads_back_and_keeps_the_events_spelling() -> None:
    assert str(ZONAL) == "aws/eu-west-1/euw1-az1/p4d.24xlarge/spot"
    assert str(REGIONAL) == "aws/eu-west-1/-/p4d.24xlarge/on_demand"
    assert Pool.parse(str(ZONAL)) == ZONAL and Pool.parse(str(REGIONAL)) == REGIONAL


@pytest.mark.parametrize("text", ["aws/eu-west-1/p4d.24xlarge/spot", "aws//-/p4d/spot", ""])
def test_other_text_is_refused_with_the_form_it_expected(text: str) -> None:
    with pytest.raises(ValueError, match="expected provider/region/zone/type/market"):
        Pool.parse(text)


def test_its_label_is_how_event_messages_word_a_pool() -> None:
    assert ZONAL.label == "aws eu-west-1/euw1-az1 p4d.24xlarge spot"
    assert REGIONAL.label == "aws eu-west-1 p4d.24xlarge on_demand"
    # The pool's two forms are its own: no module words it again.
    assert not hasattr(machine, "describe_pool") and not hasattr(windows, "describe_pool")


def test_an_offers_pool_is_a_pool_in_every_spelling() -> None:
    offer = make_offer(zone="euw1-az1", market=Market.SPOT)
    assert isinstance(offer.pool, Pool) and pool_of(offer) == offer.pool
    assert (
        pool_key(offer)
        == str(offer.pool)
        == "/".join((offer.provider, offer.region, "euw1-az1", offer.instance_type, "spot"))
    )


def test_no_module_spells_a_pool_as_a_tuple_alias_of_its_own() -> None:
    alias = re.compile(r"^Pool(Key)?\s*=\s*tuple\[", re.M)
    found = [
        str(path.relative_to(ROOT))
        for top in ("optimizer", "providers", "policies")
        for path in sorted((ROOT / top).rglob("*.py"))
        if alias.search(path.read_text())
    ]
    assert found == ["optimizer/store/history.py"]  # the store's row key: zone '' (see there)
