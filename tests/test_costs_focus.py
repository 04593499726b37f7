"""The FOCUS export against the FOCUS 1.1 specification's own column rules.

The rules (each column's feature level, nullability, data type, and the allowed values) are
in tests/data/focus-1.1-columns.yaml, read from the specification's column files.
"""

from __future__ import annotations

import csv
import io
import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from optimizer.costs import Cost, Line
from optimizer.costs.focus import COLUMNS, focus_number, write_csv

SPEC = yaml.safe_load((Path(__file__).parent / "data" / "focus-1.1-columns.yaml").read_text())
NUMERIC = re.compile(r"^-?(0|[1-9][0-9]*)(\.[0-9]+)?(E-?[0-9]+)?$")
DATETIME = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z$")
PASCAL = re.compile(r"^[A-Z][a-zA-Z0-9]*$")

MARCH = (datetime(2026, 3, 1, tzinfo=UTC), datetime(2026, 4, 1, tzinfo=UTC))
T0 = datetime(2026, 3, 10, 12, tzinfo=UTC)


def make_line(attempt: int, market: str, cost: Cost, *, ended: bool = True, **kw: Any) -> Line:
    fields: dict[str, Any] = {
        "job_id": 7,
        "job": "train",
        "policy": "eu-training",
        "attempt": attempt,
        "provider": "aws",
        "region": "eu-west-1",
        "zone": "eu-west-1a",
        "instance_type": "p5.48xlarge",
        "market": market,
        "instance_id": f"i-0{attempt}",
        "launched": T0,
        "ended": T0 + timedelta(seconds=cost.billed_seconds or 1800) if ended else None,
        "period_start": MARCH[0],
        "period_end": MARCH[1],
        "cost": cost,
        **kw,
    }
    return Line(**fields)


LINES = [
    make_line(1, "spot", Cost(5400, 45.0, 0.9, 130.0, 600, 5.0)),
    make_line(2, "on_demand", Cost(60, 1.6, 0.01, 1.6, 60, 1.6)),
    make_line(3, "spot", Cost(0, 0.0, 0.2, 40.0, refunded=True), ended=True),
    make_line(4, "spot", Cost(3600, 30.0, 0.0, 0.0, baseline_known=False), zone=None),
]


def export() -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(write_csv(LINES))))


def null(value: str) -> bool:
    return value == ""


def test_the_header_has_every_mandatory_column_and_only_focus_or_custom_ones() -> None:
    header = next(csv.reader(io.StringIO(write_csv(LINES))))
    assert tuple(header) == COLUMNS
    mandatory = {c for c, rule in SPEC["columns"].items() if rule["level"] == "Mandatory"}
    assert len(mandatory) == 21 and mandatory <= set(header)
    ours = [c for c in header if c not in SPEC["columns"]]
    assert all(c.startswith("x_") for c in ours)
    focus = [c for c in header if c in SPEC["columns"]]
    assert header[: len(focus)] == focus  # FOCUS columns first, custom ones after
    assert all(PASCAL.match(c) for c in focus)


def test_every_value_keeps_its_columns_type_nullability_and_allowed_values() -> None:
    rows = export()
    assert len(rows) == 4 + 3  # an instance row per line, a volume row where it had one
    for row in rows:
        for column, value in row.items():
            rule = SPEC["columns"].get(column)
            if rule is None:
                continue
            if null(value):
                assert rule["nulls"], f"{column} may not be null"
                continue
            kind = rule["type"]
            if kind == "Decimal":
                assert NUMERIC.match(value), f"{column}={value!r} is not FOCUS numeric"
            elif kind == "Date/Time":
                assert DATETIME.match(value), f"{column}={value!r} is not FOCUS date/time"
            elif kind == "JSON":
                parsed = json.loads(value)
                assert isinstance(parsed, dict)
                assert all(not isinstance(v, dict | list) for v in parsed.values())
            if column in SPEC["allowed"]:
                assert value in SPEC["allowed"][column], f"{column}={value!r} not allowed"
        parent = SPEC["allowed"]["ServiceSubcategory"][row["ServiceSubcategory"]]
        assert parent == row["ServiceCategory"]


def test_usage_rows_meet_the_conditional_rules() -> None:
    for row in export():
        assert row["ChargeCategory"] == "Usage"
        assert not null(row["PricingCategory"]) and not null(row["PricingQuantity"])
        assert float(row["ConsumedQuantity"]) > 0  # Usage: not null and positive
        assert row["ChargeFrequency"] != "Usage-Based" or row["ChargeCategory"] != "Purchase"
        if not null(row["ListUnitPrice"]):
            product = float(row["ListUnitPrice"]) * float(row["PricingQuantity"])
            assert product == pytest.approx(float(row["ListCost"]), abs=1e-6)
        period = (row["BillingPeriodStart"], row["BillingPeriodEnd"])
        assert period[0] <= row["ChargePeriodStart"] <= row["ChargePeriodEnd"] <= period[1]


def test_the_dataset_adds_up_to_the_ledger() -> None:
    rows = export()
    billed = sum(float(r["BilledCost"]) for r in rows)
    assert billed == pytest.approx(sum(line.cost.total_usd for line in LINES))
    instances = [r for r in rows if r["ResourceType"] == "Virtual Machine"]
    assert [r["PricingCategory"] for r in instances] == [
        "Dynamic",
        "Standard",
        "Dynamic",
        "Dynamic",
    ]
    credited = instances[2]
    assert credited["BilledCost"] == "0" and "not charged" in credited["ChargeDescription"]
    assert float(credited["ListCost"]) == 40.0  # what on-demand would have charged
    assert float(instances[0]["PricingQuantity"]) == 1.5
    assert json.loads(instances[0]["Tags"])["gpuopt/job"] == "train"
    unknown = instances[3]
    assert null(unknown["x_OnDemandCost"]) and unknown["ListCost"] == unknown["BilledCost"]
    assert null(unknown["AvailabilityZone"])


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0.0, "0"),
        (-0.0, "0"),
        (1.5, "1.5"),
        (2.0, "2"),
        (1e-12, "0"),
        (123.4567891234, "123.4567891234"),
    ],
)
def test_numbers_are_written_in_focus_numeric_format(value: float, text: str) -> None:
    assert focus_number(value) == text
    assert NUMERIC.match(text)


def test_an_owned_machines_row_names_the_team_and_prices_as_other() -> None:
    """An attempt on an owned machine (providers/ssh): billed at the machine's TCO rate, the
    provider named as the team's own, PricingCategory `Other` (neither a list price nor a
    commitment discount), and every value within the specification's rules."""
    owned = make_line(
        5,
        "owned",
        Cost(3600, 0.3, 0.0, 0.3, baseline_known=False),
        provider="ssh",
        region="eu-central-1",
        zone="fra-lab",
        instance_type="owned-1xT4",
        instance_id="gpu-a-0001",
    )
    [row] = [
        r
        for r in csv.DictReader(io.StringIO(write_csv([owned])))
        if r["ResourceId"] == "gpu-a-0001"
    ]
    assert row["PricingCategory"] == "Other"
    assert row["PricingCategory"] in SPEC["allowed"]["PricingCategory"]
    assert row["ProviderName"] == row["PublisherName"] == "Owned machines (gpuopt)"
    assert float(row["BilledCost"]) == pytest.approx(0.3)
    assert row["RegionId"] == "eu-central-1" and json.loads(row["Tags"])["gpuopt/market"] == (
        "owned"
    )
