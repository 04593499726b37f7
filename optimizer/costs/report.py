"""The ledger's lines as the surfaces show them (pure): `GET /costs` and `gpuopt costs`.

`report(lines, by)` is the JSON both return: one object per group with the figures of
docs/costs.md, and with `--by job` the group's attempts. `add_up` sums such objects (the
table's totals row), `summary` is the one line under the table ("spot saved 62% gross, 57%
net of overhead"), and `parse_time` reads `--since`/`--until` the same way on both sides.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from optimizer.costs.ledger import Cost, total
from optimizer.costs.lines import GroupBy, Line, group_lines

# The figures of every group (and of the totals row), in the order the table and CSV show them.
FIGURES: tuple[str, ...] = (
    "spend_usd",
    "storage_usd",
    "total_usd",
    "on_demand_usd",
    "savings_usd",
    "savings_fraction",
    "net_savings_fraction",
    "billed_seconds",
    "overhead_seconds",
    "overhead_usd",
)
# Figures that add up across groups; the fractions are recomputed from the sums.
_ADDITIVE = tuple(f for f in FIGURES if not f.endswith("_fraction"))

_MONTH = re.compile(r"\d{4}-\d{2}")


class TimeError(ValueError):
    """A `--since`/`--until` value that is not a month, a date or an ISO 8601 time."""


def parse_time(text: str, name: str) -> datetime:
    """`2026-03` (the month's start), `2026-03-14` (midnight) or an ISO 8601 time, UTC unless
    it names an offset. `name` is the option it came from, for the error."""
    value = text.strip()
    try:
        if _MONTH.fullmatch(value):
            return datetime(int(value[:4]), int(value[5:]), 1, tzinfo=UTC)
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        parsed = None
    if parsed is None:
        raise TimeError(
            f"{name}: expected a month (2026-03), a date (2026-03-14) or an ISO 8601 time "
            f"(2026-03-14T12:00:00Z), got {text!r}"
        )
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


def utc_text(value: datetime | None) -> str | None:
    return None if value is None else value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def figures(costs: Iterable[Cost]) -> dict[str, Any]:
    """The figures of some costs: instance spend, root-volume storage and their total over
    all of them; the on-demand baseline, savings (baseline - spend) and their fractions over
    those with a known baseline (fractions None without one); billed and overhead seconds and
    the overhead's USD over all; and whether every baseline was known."""
    items = list(costs)
    every = total(items)
    priced = total(c for c in items if c.baseline_known)
    return {
        "spend_usd": every.spend_usd,
        "storage_usd": every.storage_usd,
        "total_usd": every.total_usd,
        "on_demand_usd": priced.on_demand_usd,
        "savings_usd": priced.savings_usd,
        "savings_fraction": priced.savings_fraction,
        "net_savings_fraction": priced.net_savings_fraction,
        "billed_seconds": every.billed_seconds,
        "overhead_seconds": every.overhead_seconds,
        "overhead_usd": every.overhead_usd,
        "baseline_known": every.baseline_known,
    }


def attempts(lines: Iterable[Line]) -> list[dict[str, Any]]:
    """One object per attempt (its lines in the window summed), in job and attempt order."""
    by_attempt: dict[tuple[int, int], list[Line]] = {}
    for line in lines:
        by_attempt.setdefault((line.job_id, line.attempt), []).append(line)
    out = []
    for key in sorted(by_attempt):
        items = by_attempt[key]
        first = items[0]
        out.append(
            {
                "job": first.job,
                "attempt": first.attempt,
                "provider": first.provider,
                "region": first.region,
                "zone": first.zone,
                "instance_type": first.instance_type,
                "market": first.market,
                "instance_id": first.instance_id,
                "launched": utc_text(first.launched),
                "ended": utc_text(first.ended),
                "refunded": any(line.cost.refunded for line in items),
                "frozen": all(line.frozen for line in items),
                **figures(line.cost for line in items),
            }
        )
    return out


def report(lines: Sequence[Line], by: GroupBy) -> list[dict[str, Any]]:
    """The groups of `lines` by `by`, each with its figures, its attempt count and, grouped
    by job, its attempts."""
    out = []
    for group in group_lines(lines, by):
        row: dict[str, Any] = {"group": group.key, **figures(line.cost for line in group.lines)}
        listed = attempts(group.lines)
        row["attempt_count"] = len(listed)
        if by is GroupBy.JOB:
            row["attempts"] = listed
        out.append(row)
    return out


def add_up(groups: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The totals row of report objects: every additive figure summed, the fractions
    recomputed from the sums (each group's net fraction weighted by its baseline)."""
    rows = list(groups)
    out: dict[str, Any] = {name: sum(float(r[name]) for r in rows) for name in _ADDITIVE}
    baseline = out["on_demand_usd"]
    net = sum(float(r["net_savings_fraction"] or 0.0) * float(r["on_demand_usd"]) for r in rows)
    out["savings_fraction"] = out["savings_usd"] / baseline if baseline > 0 else None
    out["net_savings_fraction"] = net / baseline if baseline > 0 else None
    out["baseline_known"] = all(r.get("baseline_known", True) for r in rows)
    out["attempt_count"] = sum(int(r.get("attempt_count", 0)) for r in rows)
    return {"group": "total", **out}


def summary(by_market: Iterable[Mapping[str, Any]]) -> str:
    """The line under the table, from the groups by market: what spot saved against
    on-demand, gross and net of overhead."""
    spot = next((g for g in by_market if g["group"] == "spot"), None)
    if spot is None:
        return "no spot attempts in this window"
    if spot["savings_fraction"] is None:
        return "spot: no on-demand price known for its instance types, so no savings figure"
    note = "" if spot["baseline_known"] else "; attempts with no on-demand price left out"
    return (
        f"spot saved {spot['savings_fraction']:.0%} gross, "
        f"{spot['net_savings_fraction']:.0%} net of overhead "
        f"(${spot['savings_usd']:,.2f} of ${spot['on_demand_usd']:,.2f} on-demand; "
        f"overhead ${spot['overhead_usd']:,.2f}){note}"
    )
