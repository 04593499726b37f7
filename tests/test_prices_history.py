"""GET /prices/history on a real loopback server and `gpuopt prices history` end to end: one
pool's points in effect, oldest first, across the raw and hourly tiers (the daemon's own
retention pass made the hourly rows), paged without gaps or repeats, and bad input refused
with one line naming the parameter."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from optimizer.cli import app
from optimizer.clock import ManualClock
from optimizer.daemon.service import Daemon
from optimizer.store import Retention, Store
from tests.helpers import (
    DaemonProcess,
    api,
    make_config,
    make_offer,
    run_gpuopt,
    running,
    wait_until,
)

pytestmark = pytest.mark.usefixtures("daemon_env")

NOW = datetime(2026, 3, 20, 12, 0, tzinfo=UTC)
EDGE = NOW - timedelta(days=14)  # the raw retention's edge, on the hour
POOL = {"provider": "aws", "region": "us-east-1", "zone": "use1-az1", "instance_type": "g5.xlarge"}
# Three hours past the edge (to be summarized) and three after it (kept raw), every 20 minutes.
SERIES = [
    (EDGE - timedelta(hours=3) + timedelta(minutes=20 * i), 0.30 + 0.01 * i) for i in range(18)
]


def seed(store: Store) -> None:
    store.prices.record_offers(make_offer(observed_at=at, usd_per_hour=usd) for at, usd in SERIES)
    store.prices.record_offers([make_offer(zone="use1-az2", observed_at=EDGE, usd_per_hour=9.0)])


def iso(at: datetime) -> str:
    return at.isoformat().replace("+00:00", "Z")


EXPECTED = [  # hour medians at the start of each summarized hour, then the raw points
    {"at": iso(EDGE - timedelta(hours=3)), "tier": "hourly", "usd_per_hour": 0.31},
    {"at": iso(EDGE - timedelta(hours=2)), "tier": "hourly", "usd_per_hour": 0.34},
    {"at": iso(EDGE - timedelta(hours=1)), "tier": "hourly", "usd_per_hour": 0.37},
    *({"at": iso(at), "tier": "raw", "usd_per_hour": round(usd, 6)} for at, usd in SERIES[9:]),
]


def brief(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {"at": p["at"], "tier": p["tier"], "usd_per_hour": round(p["usd_per_hour"], 6)}
        for p in points
    ]


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    """A daemon on the injected clock whose first retention pass summarized the old hours."""
    config = make_config(tmp_path / "data")
    with Store(config.effective_database_url) as store:
        store.create_all()
        seed(store)
    with running(config, clock=ManualClock(NOW)) as started:
        wait_until(
            lambda: len(started.store.prices.price_points(**POOL, market="spot")) == 12,
            what="the retention pass at start",
        )
        yield started


def test_the_points_in_effect_span_both_tiers_oldest_first(daemon: Daemon) -> None:
    with api(daemon) as client:
        whole = client.get("/prices/history", params=POOL).json()
        assert brief(whole["points"]) == EXPECTED
        assert whole["next_since"] is None and whole["count"] == 12
        first = whole["points"][0]
        assert (first["min_usd"], first["max_usd"], first["points"]) == pytest.approx(
            (0.30, 0.32, 3)
        )
        raw = whole["points"][3]
        assert (raw["min_usd"], raw["max_usd"], raw["points"]) == pytest.approx((0.39, 0.39, 1))

        # Since inside a summarized hour: that hour's median is in effect, then the rest.
        window = client.get(
            "/prices/history",
            params={**POOL, "since": iso(EDGE - timedelta(minutes=30)), "until": iso(EDGE)},
        ).json()
        assert brief(window["points"]) == EXPECTED[2:3]
        without = client.get(
            "/prices/history",
            params={**POOL, "since": iso(EDGE - timedelta(minutes=30)), "prior": "false"},
        ).json()
        assert brief(without["points"]) == EXPECTED[3:]

        assert (
            client.get("/prices/history", params={**POOL, "zone": "nowhere"}).json()["points"] == []
        )


def test_pages_follow_next_since_without_gaps_or_repeats(daemon: Daemon) -> None:
    seen: list[dict[str, Any]] = []
    params: dict[str, object] = {**POOL, "limit": 5}
    with api(daemon) as client:
        while True:
            page = client.get("/prices/history", params=params).json()
            assert len(page["points"]) <= 5
            seen += page["points"]
            if page["next_since"] is None:
                break
            params = {**POOL, "limit": 5, "since": page["next_since"], "prior": "false"}
    assert brief(seen) == EXPECTED


def test_history_needs_the_token(daemon: Daemon) -> None:
    with api(daemon, token=None) as client:
        assert client.get("/prices/history", params=POOL).status_code == 401


@pytest.mark.parametrize(
    ("change", "field", "says"),
    [
        ({"provider": "azure"}, "provider", "unknown provider 'azure'; known:"),
        ({"since": "yesterday"}, "since", "valid datetime"),
        ({"since": iso(NOW), "until": iso(NOW)}, "until", "must be later than since"),
        ({"limit": 0}, "limit", "greater than or equal to 1"),
        ({"limit": 10_001}, "limit", "less than or equal to 10000"),
        ({"market": "reserved"}, "market", "'spot', 'on_demand', 'committed' or 'owned'"),
        ({"instance_type": None}, "instance_type", "Field required"),
    ],
)
def test_bad_input_is_a_422_naming_the_parameter(
    daemon: Daemon, change: dict[str, object], field: str, says: str
) -> None:
    params = {k: v for k, v in {**POOL, **change}.items() if v is not None}
    with api(daemon) as client:
        answer = client.get("/prices/history", params=params)
    assert answer.status_code == 422
    [problem] = answer.json()["detail"]
    assert problem["loc"] == ["query", field]
    assert says in problem["msg"]


def test_the_cli_pages_through_everything(
    daemon: Daemon, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("GPUOPT_API_TOKEN", "test-api-token-7Qx2")
    monkeypatch.setattr("optimizer.cli.prices.PAGE", 4)
    args = ["--provider", "aws", "--region", "us-east-1", "--zone", "use1-az1"]
    result = CliRunner().invoke(
        app,
        ["prices", "history", *args, "--instance-type", "g5.xlarge", "--json", "--api", daemon.url],
    )
    assert result.exit_code == 0, result.output
    assert brief(json.loads(result.stdout)) == EXPECTED


# -- `gpuopt prices history` as a real process against `gpuopt daemon` ------------------------


def test_gpuopt_prices_history_end_to_end(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with Store(f"sqlite:///{data / 'gpuopt.db'}") as store:
        store.create_all()
        seed(store)
        # The hourly tier as the retention pass at NOW leaves it; the daemon below runs on the
        # wall clock, with about the longest retention the config takes (ten years, the bound
        # of every number of days; the hourly tier longer than the raw one), which leaves
        # these rows as they are.
        store.prices.prune_history(Retention(timedelta(days=14), timedelta(days=400)), now=NOW)
    daemon = DaemonProcess(
        data,
        env={
            "GPUOPT_PRICES__RETENTION__RAW_DAYS": "3649",
            "GPUOPT_PRICES__RETENTION__HOURLY_DAYS": "3650",
        },
    )
    try:
        env = {"GPUOPT_API_URL": daemon.url}
        pool = ["--provider", "aws", "--region", "us-east-1", "--instance-type", "g5.xlarge"]
        zone = ["--zone", "use1-az1"]

        as_json = run_gpuopt(data, "prices", "history", *pool, *zone, "--json", env=env)
        assert as_json.returncode == 0, as_json.stderr
        assert brief(json.loads(as_json.stdout)) == EXPECTED

        since = ["--since", "2026-03-06T11:30:00+00:00", "--until", "2026-03-06T12:30Z"]
        as_csv = run_gpuopt(data, "prices", "history", *pool, *zone, *since, "--csv", env=env)
        assert as_csv.returncode == 0, as_csv.stderr
        rows = list(csv.DictReader(io.StringIO(as_csv.stdout)))
        assert [(r["at"], r["tier"], r["points"]) for r in rows] == [
            (iso(EDGE - timedelta(hours=1)), "hourly", "3"),  # in effect at --since
            (iso(EDGE), "raw", "1"),
            (iso(EDGE + timedelta(minutes=20)), "raw", "1"),
        ]

        since = ["--since", "2026-03-06T11:30", "--until", "2026-03-06T12:01"]
        table = run_gpuopt(data, "prices", "history", *pool, *zone, *since, env=env)
        assert table.returncode == 0, table.stderr
        assert "aws us-east-1 use1-az1 g5.xlarge spot: 2 points in effect" in table.stdout
        lines = [line for line in table.stdout.splitlines() if "2026-03-06T" in line]
        assert [line.split("│")[1:4] for line in lines] == [
            [" 2026-03-06T11:00:00Z ", " hourly ", " 0.3700 "],
            [" 2026-03-06T12:00:00Z ", " raw    ", " 0.3900 "],
        ]

        regional = run_gpuopt(data, "prices", "history", *pool, env=env)
        assert regional.returncode == 0
        assert "No price points for aws us-east-1 (regional) g5.xlarge spot" in regional.stdout
        assert "needs --zone" in regional.stdout

        for args, line in [
            (["--provider", "azure"], "gpuopt: error: --provider: unknown provider 'azure'"),
            (["--until", "2026-02-30"], "gpuopt: error: --until: '2026-02-30' is not an ISO"),
            (["--json", "--csv"], "gpuopt: error: --json and --csv: choose one"),
        ]:
            bad = run_gpuopt(data, "prices", "history", *pool, *args, env=env)
            assert bad.returncode == 2 and bad.stdout == ""
            assert bad.stderr.startswith(line) and bad.stderr.count("\n") == 1, bad.stderr
    finally:
        daemon.stop()
    assert daemon.proc.returncode == 0


def test_no_daemon_is_one_line(tmp_path: Path) -> None:
    pool = ["--provider", "aws", "--region", "us-east-1", "--instance-type", "g5.xlarge"]
    done = run_gpuopt(
        tmp_path,
        "prices",
        "history",
        *pool,
        env={"GPUOPT_API_TOKEN": "t", "GPUOPT_API_URL": "http://127.0.0.1:9"},
    )
    assert done.returncode == 2
    assert done.stderr.startswith("gpuopt: error: cannot reach the daemon at http://127.0.0.1:9")
