"""Schedule windows in policies: parsing with located errors, the policy in force at an
instant, and the transitions between windows, across summer-time changes."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from policies.loader import PolicyError, parse_policy
from policies.schedule import (
    Transition,
    changes,
    effective,
    occurrences,
    transitions,
    window_at,
)
from policies.schema import Policy, Schedule
from policies.windows import DAYS, first_instant

ISSUE_EXAMPLE = """\
apiVersion: gpuopt/v1
kind: Policy
name: team
markets: [spot, on_demand]
bid: {max_fraction_of_on_demand: 0.6}
schedule:
  timezone: Europe/Berlin
  windows:
    - name: office-hours
      days: [mon, tue, wed, thu, fri]
      hours: "09:00-18:00"
      markets: [on_demand]            # any policy key that makes sense per window:
      bid: {max_usd_per_hour: 40}     # markets, bid, placement, rank_by
    # outside every window the policy's top-level values apply
"""


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)  # type: ignore[misc]


def schedule(zone: str, *windows: dict[str, Any]) -> Schedule:
    return Schedule.model_validate({"timezone": zone, "windows": list(windows)})


def problems(text: str) -> list[str]:
    with pytest.raises(PolicyError) as caught:
        parse_policy(text, path="team.yaml")
    return [str(p) for p in caught.value.problems]


# -- parsing ---------------------------------------------------------------------------------


def test_the_issue_example_parses_and_office_hours_switch_to_on_demand() -> None:
    policy = parse_policy(ISSUE_EXAMPLE, path="team.yaml")
    tuesday_10_berlin = datetime(2026, 12, 1, 10, 0, tzinfo=ZoneInfo("Europe/Berlin"))
    inside = effective(policy, tuesday_10_berlin)
    assert inside.markets == ["on_demand"]
    assert inside.bid.max_usd_per_hour == 40
    # a window's key replaces the policy's key whole: the fraction cap is not in force
    assert inside.bid.max_fraction_of_on_demand is None
    assert inside.schedule is None
    evening = effective(policy, tuesday_10_berlin.replace(hour=18))
    assert evening.markets == ["spot", "on_demand"]
    assert evening.bid.max_fraction_of_on_demand == 0.6
    saturday = effective(policy, datetime(2026, 12, 5, 10, 0, tzinfo=ZoneInfo("Europe/Berlin")))
    assert saturday.markets == ["spot", "on_demand"]


def test_overlapping_windows_are_a_located_error_naming_both() -> None:
    text = ISSUE_EXAMPLE + (
        "    - name: night\n"
        "      days: [fri]\n"
        '      hours: "17:00-06:00"\n'
        "      rank_by: expected_cost\n"
    )
    assert problems(text) == [
        "team.yaml:17:14: schedule.windows[1].hours: window 'night' overlaps window "
        "'office-hours' (windows[0]): fri 17:00 to sat 06:00 meets fri 09:00 to fri 18:00; "
        "windows may not overlap"
    ]


def test_a_window_across_sunday_midnight_overlaps_mondays_morning() -> None:
    with pytest.raises(ValidationError) as caught:
        schedule(
            "UTC",
            {"name": "early", "days": ["mon"], "hours": "00:00-02:00"},
            {"name": "late", "days": ["sun"], "hours": "23:00-01:00"},
        )
    (error,) = caught.value.errors()
    assert error["loc"] == ("windows", 1, "hours")
    assert "sun 23:00 to mon 01:00 meets mon 00:00 to mon 02:00" in error["msg"]


def test_windows_that_touch_do_not_overlap() -> None:
    found = schedule(
        "UTC",
        {"name": "day", "hours": "06:00-22:00"},
        {"name": "night", "hours": "22:00-06:00"},
    )
    assert [w.name for w in found.windows] == ["day", "night"]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (
            "  timezone: Europe/Berln\n",
            "team.yaml:7:13: schedule.timezone: unknown time zone 'Europe/Berln': use an IANA "
            "name such as Europe/Berlin, America/New_York or UTC",
        ),
    ],
)
def test_an_unknown_time_zone_is_located(line: str, message: str) -> None:
    text = ISSUE_EXAMPLE.replace("  timezone: Europe/Berlin\n", line)
    assert problems(text) == [message]


@pytest.mark.parametrize(
    ("hours", "message"),
    [
        ('"9-18"', "is not a span of hours: write HH:MM-HH:MM in local time"),
        ('"25:00-18:00"', "the start must be 00:00 to 23:59"),
        ('"09:00-24:30"', "the end must be 00:00 to 24:00"),
        ('"09:00-09:00"', "starts where it ends; a whole day is 00:00-24:00"),
    ],
)
def test_bad_hours_are_located_at_the_hours(hours: str, message: str) -> None:
    text = ISSUE_EXAMPLE.replace('"09:00-18:00"', hours)
    (found,) = problems(text)
    assert found.startswith("team.yaml:11:14: schedule.windows[0].hours: ")
    assert message in found


def test_unknown_days_duplicate_names_and_keys_are_located() -> None:
    text = ISSUE_EXAMPLE.replace("[mon, tue, wed, thu, fri]", "[mon, tues]")
    (found,) = problems(text)
    assert found.startswith("team.yaml:10:") and "schedule.windows[0].days[1]" in found
    twice = (
        ISSUE_EXAMPLE + '    - name: office-hours\n      days: [sat]\n      hours: "09:00-10:00"\n'
    )
    assert problems(twice) == [
        "team.yaml:15:13: schedule.windows[1].name: window name 'office-hours' is already "
        "used by windows[0]"
    ]
    unknown = ISSUE_EXAMPLE.replace("      markets: [on_demand]", "      budget: {monthly_usd: 1}")
    (found,) = problems(unknown)
    assert found == (
        "team.yaml:12:7: schedule.windows[0].budget: unknown field; it belongs at 'budget'"
    )


def test_a_window_can_set_placement_and_rank_by() -> None:
    found = schedule(
        "UTC",
        {
            "name": "eu-day",
            "hours": "08:00-20:00",
            "placement": {"compliance": "gdpr"},
            "rank_by": "expected_cost",
        },
    )
    policy = Policy.model_validate(
        {"apiVersion": "gpuopt/v1", "kind": "Policy", "name": "p", "schedule": found}
    )
    inside = effective(policy, utc(2026, 6, 1, 9))
    assert inside.placement.compliance == "eu" and inside.rank_by == "expected_cost"
    assert [str(c) for c in changes(policy, inside)][1:] == ["rank_by price -> expected_cost"]


# -- the clock: hand-checked instants around summer time ------------------------------------


def test_a_window_starting_in_the_skipped_hour_starts_when_the_clock_jumps() -> None:
    # Berlin, Sunday 29 March 2026: 02:00 CET becomes 03:00 CEST at 01:00 UTC.
    found = schedule("Europe/Berlin", {"name": "w", "days": ["sun"], "hours": "02:30-04:00"})
    (occ,) = occurrences(found, utc(2026, 3, 29), utc(2026, 3, 30))
    assert (occ.start, occ.end) == (utc(2026, 3, 29, 1), utc(2026, 3, 29, 2))


def test_a_window_ending_in_the_repeated_hour_ends_at_its_first_showing() -> None:
    # Berlin, Sunday 25 October 2026: 03:00 CEST becomes 02:00 CET at 01:00 UTC.
    found = schedule("Europe/Berlin", {"name": "w", "days": ["sat"], "hours": "22:00-02:30"})
    (occ,) = occurrences(found, utc(2026, 10, 24), utc(2026, 10, 26))
    assert (occ.start, occ.end) == (utc(2026, 10, 24, 20), utc(2026, 10, 25, 0, 30))
    # 02:15 CET (01:15 UTC) shows a time inside the hours, but the window has ended
    assert window_at(found, utc(2026, 10, 25, 1, 15)) is None


def test_a_window_over_new_yorks_repeated_hour_lasts_an_hour_longer() -> None:
    # New York, Sunday 1 November 2026: 02:00 EDT becomes 01:00 EST at 06:00 UTC.
    found = schedule("America/New_York", {"name": "w", "days": ["sun"], "hours": "01:30-03:00"})
    (occ,) = occurrences(found, utc(2026, 11, 1), utc(2026, 11, 2))
    assert (occ.start, occ.end) == (utc(2026, 11, 1, 5, 30), utc(2026, 11, 1, 8))
    assert window_at(found, utc(2026, 11, 1, 6, 15)).name == "w"  # type: ignore[union-attr]


def test_a_cross_midnight_window_is_in_force_after_midnight_on_the_next_day() -> None:
    found = schedule("America/New_York", {"name": "night", "days": ["fri"], "hours": "22:00-06:00"})
    saturday_5am = datetime(2026, 7, 11, 5, 0, tzinfo=ZoneInfo("America/New_York"))
    assert window_at(found, saturday_5am).name == "night"  # type: ignore[union-attr]
    assert window_at(found, saturday_5am + timedelta(hours=1)) is None
    assert window_at(found, saturday_5am - timedelta(days=1)) is None  # friday 05:00


def test_transitions_list_the_coming_boundaries_and_join_back_to_back_days() -> None:
    found = schedule(
        "Europe/Berlin",
        {"name": "weekend", "days": ["sat", "sun"], "hours": "00:00-24:00"},
        {"name": "office-hours", "days": ["mon"], "hours": "00:00-09:00"},
    )
    got = transitions(found, utc(2026, 3, 27), utc(2026, 3, 31))
    assert got == [
        Transition(utc(2026, 3, 27, 23), None, "weekend"),  # Saturday 00:00 CET
        Transition(utc(2026, 3, 29, 22), "weekend", "office-hours"),  # Monday 00:00 CEST
        Transition(utc(2026, 3, 30, 7), "office-hours", None),
    ]


def test_instants_must_be_aware() -> None:
    found = schedule("UTC", {"name": "w", "hours": "00:00-01:00"})
    with pytest.raises(ValueError, match="aware instant"):
        window_at(found, datetime(2026, 1, 1))


# -- properties --------------------------------------------------------------------------------

ZONES = ["Europe/Berlin", "America/New_York"]
# Summer-time changes of 2026 in both zones, to aim instants at.
CHANGES = [utc(2026, 3, 8, 7), utc(2026, 3, 29, 1), utc(2026, 10, 25, 1), utc(2026, 11, 1, 6)]

half_hours = st.integers(0, 47).map(lambda h: f"{h // 2:02d}:{h % 2 * 30:02d}")
window_specs = st.fixed_dictionaries(
    {
        "days": st.lists(st.sampled_from(DAYS), min_size=1, max_size=7, unique=True),
        "start": half_hours,
        "end": st.one_of(half_hours, st.just("24:00")),
    }
)
instants = st.one_of(
    st.sampled_from(CHANGES).flatmap(
        lambda c: st.integers(-36 * 3600, 36 * 3600).map(lambda s: c + timedelta(seconds=s))
    ),
    st.datetimes(datetime(2026, 1, 1), datetime(2027, 12, 31)).map(lambda d: d.replace(tzinfo=UTC)),
)


def _spec_windows(specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {"name": f"w{i}", "days": s["days"], "hours": f"{s['start']}-{s['end']}"}
        for i, s in enumerate(specs)
    ]


def _wall_minutes(spec: dict[str, Any]) -> set[int]:
    """The minutes of the week a window covers, by brute force (the test's own oracle)."""
    start, end = (int(t[:2]) * 60 + int(t[3:]) for t in (spec["start"], spec["end"]))
    length = end - start if end > start else end + 1440 - start
    week = 7 * 1440
    out: set[int] = set()
    for day in spec["days"]:
        first = DAYS.index(day) * 1440 + start
        out.update(m % week for m in range(first, first + length))
    return out


def _valid(specs: list[dict[str, Any]]) -> bool:
    if any(s["start"] == s["end"] for s in specs):
        return False
    covered = [_wall_minutes(s) for s in specs]
    return all(not (covered[i] & covered[j]) for i in range(len(specs)) for j in range(i))


@settings(max_examples=300, deadline=None)
@given(st.lists(window_specs, min_size=1, max_size=3), st.sampled_from(ZONES))
def test_a_schedule_parses_exactly_when_no_two_windows_share_a_minute(
    specs: list[dict[str, Any]], zone: str
) -> None:
    expected = _valid(specs)
    try:
        schedule(zone, *_spec_windows(specs))
    except ValidationError:
        assert not expected
    else:
        assert expected


def _valid_schedule(specs: list[dict[str, Any]], zone: str) -> Schedule:
    assume(_valid(specs))
    return schedule(zone, *_spec_windows(specs))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(st.lists(window_specs, min_size=1, max_size=3), st.sampled_from(ZONES), instants)
def test_the_window_in_force_follows_the_transitions(
    specs: list[dict[str, Any]], zone: str, start: datetime
) -> None:
    found = _valid_schedule(specs, zone)
    until = start + timedelta(days=3)
    state = window_at(found, start)
    current = None if state is None else state.name
    for edge in transitions(found, start, until):
        assert edge.before == current and edge.after != edge.before
        at_edge = window_at(found, edge.at)
        just_before = window_at(found, edge.at - timedelta(seconds=1))
        assert (None if at_edge is None else at_edge.name) == edge.after
        assert (None if just_before is None else just_before.name) == edge.before
        current = edge.after
    last = window_at(found, until)
    assert (None if last is None else last.name) == current


def _steady_day(tz: ZoneInfo, when: datetime) -> bool:
    """No summer-time change within two days of `when` (local wall time is then exact)."""
    offsets = {(when + timedelta(hours=h)).astimezone(tz).utcoffset() for h in range(-48, 49, 6)}
    return len(offsets) == 1


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(st.lists(window_specs, min_size=1, max_size=3), st.sampled_from(ZONES), instants)
def test_away_from_summer_time_changes_a_window_is_its_wall_clock_hours(
    specs: list[dict[str, Any]], zone: str, when: datetime
) -> None:
    found = _valid_schedule(specs, zone)
    tz = ZoneInfo(zone)
    assume(_steady_day(tz, when))
    local = when.astimezone(tz)
    minute = local.weekday() * 1440 + local.hour * 60 + local.minute
    expected = [f"w{i}" for i, s in enumerate(specs) if minute in _wall_minutes(s)]
    got = window_at(found, when)
    assert ([] if got is None else [got.name]) == expected


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(st.lists(window_specs, min_size=1, max_size=3), st.sampled_from(ZONES), instants)
def test_occurrences_never_overlap_and_last_their_hours_give_or_take_the_clock_change(
    specs: list[dict[str, Any]], zone: str, start: datetime
) -> None:
    found = _valid_schedule(specs, zone)
    occs = occurrences(found, start, start + timedelta(days=4))
    for a, b in itertools.pairwise(occs):
        assert a.end <= b.start
    by_name = {w.name: w.parsed_hours().minutes for w in found.windows}
    for occ in occs:
        real = (occ.end - occ.start).total_seconds() / 60
        assert real > 0 and abs(real - by_name[occ.window]) <= 60


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(ZONES),
    st.sampled_from(CHANGES).flatmap(
        lambda c: st.integers(-3 * 3600, 3 * 3600).map(lambda s: c + timedelta(seconds=s))
    ),
)
def test_first_instant_is_the_first_moment_the_clock_shows_a_time(
    zone: str, near: datetime
) -> None:
    tz = ZoneInfo(zone)
    wall = near.astimezone(tz).replace(tzinfo=None, microsecond=0)
    got = first_instant(tz, wall)
    assert got.astimezone(tz).replace(tzinfo=None) >= wall
    # no earlier second shows a time at or past `wall`... within the three hours around it
    for back in range(1, 3 * 3600, 97):
        earlier = got - timedelta(seconds=back)
        assert earlier.astimezone(tz).replace(tzinfo=None) < wall
