"""GPU telemetry in the store, on SQLite and PostgreSQL: a minute stored once per attempt,
reads by attempt and by job since a time, the summary's current and average utilization and
peak memory, and minutes folded into hours (merging a late minute) and then expired."""

from __future__ import annotations

from datetime import timedelta

import pytest

from optimizer.store import GpuMinute, Store
from optimizer.store.jobs import AttemptRecord
from optimizer.store.telemetry import HOUR_S, MINUTE_S
from tests.helpers import T0, make_offer


def attempt_of(store: Store, job: str, number: int = 1) -> AttemptRecord:
    found = store.jobs.get_job(job)
    job_id = found.id if found else store.jobs.add_job(job, "small", {"run": "x"}, at=T0)
    offer = make_offer(provider="local", region="eu-west-1", zone="eu-west-1-a", observed_at=T0)
    return store.jobs.create_attempt(job_id, number, f"{job}-{number}", offer, "sha", T0)


def minute(i: int, util: float, used: float, **kw: object) -> GpuMinute:
    fields: dict[object, object] = {
        "start": T0 + timedelta(minutes=i),
        "samples": 6,
        "gpus": 2,
        "util_mean": util,
        "util_max": min(1.0, util + 0.05),
        "memory_used_gib_max": used,
        "memory_total_gib": 160.0,
        "power_w_mean": 300.0,
        "temperature_c_max": 60.0 + i,
        "sm_clock_mhz_mean": 1800.0,
    }
    fields.update(kw)
    return GpuMinute(**fields)  # type: ignore[arg-type]


def test_a_minute_sent_again_is_stored_once_and_reads_come_back_in_order(store: Store) -> None:
    a = attempt_of(store, "train")
    assert store.telemetry.add(a.id, [minute(0, 0.5, 10.0), minute(1, 0.7, 20.0)]) == 2
    # The same minutes again, one with its start a few seconds in: nothing new.
    again = minute(1, 0.1, 99.0, start=T0 + timedelta(minutes=1, seconds=30))
    assert store.telemetry.add(a.id, [minute(0, 0.5, 10.0), again, minute(2, 0.9, 3.0)]) == 1
    # A minute sent while it was going (2 samples), then whole (6): the whole one wins.
    assert store.telemetry.add(a.id, [minute(2, 0.1, 1.0, samples=2)]) == 0
    assert store.telemetry.add(a.id, [minute(2, 0.9, 15.0, samples=7)]) == 1
    rows = store.telemetry.samples(attempt_id=a.id)
    assert [(r.start, r.util_mean, r.memory_used_gib_max) for r in rows] == [
        (T0, 0.5, 10.0),
        (T0 + timedelta(minutes=1), 0.7, 20.0),
        (T0 + timedelta(minutes=2), 0.9, 15.0),
    ]
    assert [r.start for r in store.telemetry.samples(attempt_id=a.id, since=rows[1].start)] == [
        rows[1].start,
        rows[2].start,
    ]
    assert rows[0].span_s == MINUTE_S and rows[0].gpus == 2 and not rows[0].simulated


def test_bad_readings_are_refused_with_the_field_named(store: Store) -> None:
    a = attempt_of(store, "train")
    with pytest.raises(ValueError, match="util_mean"):
        store.telemetry.add(a.id, [minute(0, 1.5, 1.0)])
    with pytest.raises(ValueError, match="timezone-aware"):
        store.telemetry.add(a.id, [minute(0, 0.5, 1.0, start=T0.replace(tzinfo=None))])
    assert store.telemetry.samples(attempt_id=a.id) == []


def test_the_summary_covers_every_attempt_of_the_job(store: Store) -> None:
    one, two = attempt_of(store, "train", 1), attempt_of(store, "train", 2)
    other = attempt_of(store, "eval")
    store.telemetry.add(one.id, [minute(0, 0.2, 40.0, throttle_reasons=4, xids=(79,))])
    store.telemetry.add(one.id, [minute(1, 0.4, 30.0, samples=3)])
    store.telemetry.add(two.id, [minute(5, 0.8, 20.0, simulated=True)])
    store.telemetry.add(other.id, [minute(9, 0.01, 150.0)])
    s = store.telemetry.summary(job_id=one.job_id)
    assert s is not None
    assert (s.attempt_id, s.current_at, s.current_util) == (two.id, T0 + timedelta(minutes=5), 0.8)
    # Weighted by samples: (0.2*6 + 0.4*3 + 0.8*6) / 15.
    assert s.average_util == pytest.approx((1.2 + 1.2 + 4.8) / 15)
    assert (s.peak_memory_used_gib, s.memory_total_gib) == (40.0, 160.0)
    assert s.peak_memory_used_ratio == pytest.approx(0.25)
    assert (s.spans, s.samples, s.simulated, s.throttle_reasons, s.xids) == (3, 15, True, 4, (79,))
    since = store.telemetry.summary(job_id=one.job_id, since=T0 + timedelta(minutes=1))
    assert since is not None and since.peak_memory_used_gib == 30.0
    assert store.telemetry.summary(attempt_id=one.id) is not None
    assert store.telemetry.summary(job_id=other.job_id + 100) is None
    latest = store.telemetry.latest([one.id, two.id, other.id + 100])
    assert {k: v.start for k, v in latest.items()} == {
        one.id: T0 + timedelta(minutes=1),
        two.id: T0 + timedelta(minutes=5),
    }


def test_minutes_fold_into_hours_a_late_minute_merges_and_old_hours_expire(store: Store) -> None:
    a = attempt_of(store, "train")
    # Two minutes of hour 0, one of hour 1, one of hour 2 (after the cutoff).
    store.telemetry.add(
        a.id,
        [
            minute(0, 0.2, 10.0, throttle_reasons=1),
            minute(30, 0.6, 50.0, samples=2, xids=(48,)),
            minute(60, 1.0, 5.0),
            minute(120, 0.5, 5.0),
        ],
    )
    cutoff = T0 + timedelta(minutes=120, seconds=10)  # floored: hours 0 and 1 are wholly past
    first = store.telemetry.downsample(before=cutoff, limit=2)
    assert (first.minutes, first.hours) == (2, 1)
    second = store.telemetry.downsample(before=cutoff)
    assert (second.minutes, second.hours) == (1, 1)
    assert store.telemetry.downsample(before=cutoff).minutes == 0  # nothing left: idempotent
    rows = store.telemetry.samples(attempt_id=a.id)
    assert [(r.start, r.span_s) for r in rows] == [
        (T0, HOUR_S),
        (T0 + timedelta(hours=1), HOUR_S),
        (T0 + timedelta(hours=2), MINUTE_S),
    ]
    hour0 = rows[0]
    assert hour0.util_mean == pytest.approx((0.2 * 6 + 0.6 * 2) / 8)
    assert (hour0.samples, hour0.memory_used_gib_max, hour0.util_max) == (8, 50.0, 0.65)
    assert (hour0.throttle_reasons, hour0.xids, hour0.temperature_c_max) == (1, (48,), 90.0)
    # A minute of hour 0 that arrives late is merged into the hour on the next pass.
    store.telemetry.add(a.id, [minute(59, 0.0, 70.0, samples=8)])
    assert store.telemetry.downsample(before=cutoff).minutes == 1
    merged = store.telemetry.samples(attempt_id=a.id)[0]
    assert (merged.span_s, merged.samples, merged.memory_used_gib_max) == (HOUR_S, 16, 70.0)
    assert merged.util_mean == pytest.approx((0.2 * 6 + 0.6 * 2) / 16)
    # Expiry drops whatever started before its cutoff.
    assert store.telemetry.expire(before=T0 + timedelta(hours=1)) == 1
    assert store.telemetry.samples(attempt_id=a.id)[0].start == T0 + timedelta(hours=1)


def test_the_retention_loop_downsamples_minutes_to_hours_then_expires_them(store: Store) -> None:
    from optimizer.clock import ManualClock
    from optimizer.daemon.loops.retention import RetentionLoop
    from optimizer.store import Retention

    clock = ManualClock(T0)
    a = attempt_of(store, "train")
    # 3 hours of one minute every 20 minutes: hour 0 has minutes 0, 20, 40; and so on.
    store.telemetry.add(a.id, [minute(m, 0.1 * (m // 60 + 1), m / 10) for m in range(0, 180, 20)])
    loop = RetentionLoop(
        store,
        clock,
        Retention(timedelta(days=14), timedelta(days=400)),
        log_batch=2,  # several transactions a pass
        telemetry_retention=(timedelta(days=1), timedelta(days=30)),
    )
    # Within a day nothing moves.
    clock.set(T0 + timedelta(hours=23))
    report = loop.run_once()
    assert (report.gpu_minutes, report.gpu_expired) == (0, 0)
    # A day and 2 hours on, hours 0 and 1 are wholly past the per-minute retention.
    clock.set(T0 + timedelta(days=1, hours=2, minutes=30))
    report = loop.run_once()
    assert (report.gpu_minutes, report.gpu_hours, report.gpu_expired) == (6, 4, 0)
    rows = store.telemetry.samples(attempt_id=a.id)
    assert [(r.start - T0, r.span_s) for r in rows] == [
        (timedelta(0), HOUR_S),
        (timedelta(hours=1), HOUR_S),
        (timedelta(hours=2), MINUTE_S),
        (timedelta(hours=2, minutes=20), MINUTE_S),
        (timedelta(hours=2, minutes=40), MINUTE_S),
    ]
    assert rows[1].util_mean == pytest.approx(0.2) and rows[1].samples == 18
    assert rows[1].memory_used_gib_max == pytest.approx(10.0)  # minute 100's 10 GiB
    assert loop.run_once().gpu_minutes == 0  # a second pass finds nothing to do
    # The summary reads both sizes alike.
    s = store.telemetry.summary(attempt_id=a.id)
    assert s is not None and s.samples == 9 * 6 and s.average_util == pytest.approx(0.2)
    # Past the hourly retention every span goes.
    clock.set(T0 + timedelta(days=31))
    report = loop.run_once()
    assert (report.gpu_minutes, report.gpu_expired) == (3, 3)
    assert store.telemetry.samples(attempt_id=a.id) == []
