"""The ledger's lines as the surfaces show them (pure): `GET /costs` and `gpuopt costs`.

`report(groups, lines)` is the JSON both return: one object per group (`Totals`) with the
figures of docs/costs.md, and with `--by job` the group's attempts from its lines. `add_up`
sums such objects (the table's totals row), `summary` is the one line under the table ("spot
saved 62% gross, 57% net of overhead"), and `parse_time` reads `--since`/`--until` the same
way on both sides.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from optimizer import clock
from optimizer.common.jobnames import job_label
from optimizer.common.times import TimeRangeError, in_span
from optimizer.costs.ledger import Cost, total
from optimizer.costs.lines import INSTANCE, Line, Totals

# The figures of every group (and of the totals row), in the order the table and CSV show them.
FIGURES: tuple[str, ...] = (
    "spend_usd",
    "storage_usd",
    "network_usd",
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
    """A `--since`/`--until` value that is not a month, a date or an ISO 8601 time, or one
    outside the span gpuopt reads (optimizer/common/times.py)."""


def parse_time(text: str, name: str) -> datetime:
    """`2026-03` (the month's start), `2026-03-14` (midnight) or an ISO 8601 time, UTC unless
    it names an offset, from 1970 to 2200. `name` is the option it came from, for the error."""
    value = text.strip()
    try:
        if _MONTH.fullmatch(value):
            parsed = datetime(int(value[:4]), int(value[5:]), 1, tzinfo=UTC)
        else:
            parsed = clock.parse_utc(value.replace("z", "Z"))
    except ValueError:
        parsed = None
    if parsed is None:
        raise TimeError(
            f"{name}: expected a month (2026-03), a date (2026-03-14) or an ISO 8601 time "
            f"(2026-03-14T12:00:00Z), got {text!r}"
        )
    try:
        return in_span(parsed, name)
    except TimeRangeError as exc:
        raise TimeError(str(exc)) from None


def utc_text(value: datetime | None) -> str | None:
    return None if value is None else clock.utc_text(value)


def figures(every: Cost, priced: Cost) -> dict[str, Any]:
    """A group's figures from its sums over all its lines (`every`) and over those with a
    known baseline (`priced`): instance spend, root-volume storage and their total, billed and
    overhead seconds and the overhead's USD over all; the on-demand baseline, savings
    (baseline - spend) and their fractions (None without a baseline) over the priced ones;
    and whether every baseline was known."""
    return {
        "spend_usd": every.spend_usd,
        "storage_usd": every.storage_usd,
        "network_usd": every.network_usd,
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


def line_figures(lines: Iterable[Line]) -> dict[str, Any]:
    """The figures of some lines (see `figures`)."""
    items = [line.cost for line in lines]
    return figures(total(items), total(c for c in items if c.baseline_known))


def attempts(lines: Iterable[Line]) -> list[dict[str, Any]]:
    """One object per attempt (its lines in the window summed), in job and attempt order."""
    by_attempt: dict[tuple[int, int], list[Line]] = {}
    for line in lines:
        if line.kind == INSTANCE:  # the job's state lines are no attempt's
            by_attempt.setdefault((line.job_id, line.attempt), []).append(line)
    out = []
    for key in sorted(by_attempt):
        items = by_attempt[key]
        first = items[0]
        out.append(
            {
                "job": job_label(first.job),
                "attempt": first.attempt,
                "role": first.role,  # `job`, or `warm_spare` (docs/costs.md)
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
                **line_figures(items),
            }
        )
    return out


def report(groups: Sequence[Totals], lines: Sequence[Line] | None = None) -> list[dict[str, Any]]:
    """One object per group with its figures and attempt count; where the groups were split by
    market, `markets`: the same figures per market; with `lines` (the groups are jobs,
    `totals_by(lines, GroupBy.JOB)`), each job's attempts from them."""
    by_job: dict[str, list[Line]] = {}
    for line in lines or ():
        by_job.setdefault(line.job, []).append(line)
    out = []
    for group in groups:
        row: dict[str, Any] = {
            "group": job_label(group.key),  # a removed job's name as people know it
            **figures(group.cost, group.priced),
            "attempt_count": group.attempts,
        }
        if group.markets:
            row["markets"] = {
                m.key: {**figures(m.cost, m.priced), "attempt_count": m.attempts}
                for m in group.markets
            }
        if lines is not None:
            row["attempts"] = attempts(by_job.get(group.key, []))
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


def summary(groups: Iterable[Mapping[str, Any]]) -> str:
    """The line under the table, from report objects split by market (`markets`): what spot
    saved against on-demand, gross and net of overhead, over all the groups; and what the
    owned machines' attempts cost at their TCO rate, where there were any."""
    rows = list(groups)
    line = _spot_line(rows)
    owned = [g["markets"]["owned"] for g in rows if "owned" in g.get("markets", {})]
    if owned:
        o = add_up(owned)
        line += (
            f"; owned machines: ${o['spend_usd']:,.2f} for {o['billed_seconds'] / 3600:,.1f} h "
            "at their TCO rate"
        )
    return line


def _spot_line(groups: list[Mapping[str, Any]]) -> str:
    parts = [g["markets"]["spot"] for g in groups if "spot" in g.get("markets", {})]
    if not parts:
        return "no spot attempts in this window"
    spot = add_up(parts)
    if spot["savings_fraction"] is None:
        return "spot: no on-demand price known for its instance types, so no savings figure"
    note = "" if spot["baseline_known"] else "; attempts with no on-demand price left out"
    return (
        f"spot saved {spot['savings_fraction']:.0%} gross, "
        f"{spot['net_savings_fraction']:.0%} net of overhead "
        f"(${spot['savings_usd']:,.2f} of ${spot['on_demand_usd']:,.2f} on-demand; "
        f"overhead ${spot['overhead_usd']:,.2f}){note}"
    )
