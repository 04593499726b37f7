"""`gpuopt backtest --traces`: the JSON rows, the table, and bad input as located errors;
and, where the public traces are at hand (GPUOPT_SPOT_TRACES), a replay on them."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from optimizer.cli import app
from policies.deadline import optimum, read_traces, replay, strategy

KEYS = {
    "trace",
    "start_hours",
    "cost_usd",
    "on_demand_cost_usd",
    "deadline_met",
    "restarts",
    "spot_hours",
    "on_demand_hours",
    "optimum_cost_usd",
    "greedy_cost_usd",
}


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    # 10-minute ticks: spot in a for the first hour, in b for the second
    (tmp_path / "traces").mkdir()
    for zone, counts in (("us-east-1a", [1] * 6 + [0] * 18), ("us-west-2b", [0] * 6 + [1] * 18)):
        body = {"metadata": {"gap_seconds": 600}, "data": counts}
        (tmp_path / "traces" / f"{zone}_v100_1.json").write_text(json.dumps(body))
    return tmp_path / "traces"


def backtest(*args: str) -> tuple[int, str]:
    run = CliRunner().invoke(app, ["backtest", *args])
    return run.exit_code, run.output


def test_json_gives_one_row_per_trace_and_start_with_the_references(folder: Path) -> None:
    code, out = backtest(
        "--traces", str(folder), "--work", "1h", "--deadline", "2h", "--restart-overhead",
        "6m", "--on-demand-price", "3", "--spot-price", "0.9", "--starts", "2", "--json",
    )  # fmt: skip
    assert code == 0, out
    rows = json.loads(out)
    assert [(r["trace"], r["start_hours"]) for r in rows] == [
        ("us-east-1a_v100_1.json", 0.0),
        ("us-east-1a_v100_1.json", 1.0),
        ("us-west-2b_v100_1.json", 0.0),
        ("us-west-2b_v100_1.json", 1.0),
    ]
    assert all(set(r) >= KEYS and r["deadline_met"] for r in rows)
    first = rows[0]  # spot from the start: 6 min start-up + 54 min, then on-demand
    assert first["on_demand_cost_usd"] == pytest.approx(3.3)  # (1 h + 0.1 h) x $3/h
    assert first["optimum_cost_usd"] <= first["cost_usd"] <= first["on_demand_cost_usd"]


def test_multi_zone_replays_the_folder_as_one_job_and_moves_between_zones(folder: Path) -> None:
    code, out = backtest(
        "--traces", str(folder), "--multi-zone", "--work", "1.5h", "--deadline", "3h",
        "--restart-overhead", "6m", "--on-demand-price", "3", "--json",
    )  # fmt: skip
    assert code == 0, out
    (row,) = json.loads(out)
    assert row["zones"] == ["us-east-1a", "us-west-2b"]
    # spot at 0.3 x $3/h: 6 min start-up and 54 min in a, then 6 + 36 min in b (1.7 h)
    assert row["cost_usd"] == pytest.approx(1.7 * 0.9) and row["restarts"] == 1
    # knowing the future, one start in b at 1 h does it all: 6 + 90 min
    assert row["optimum_cost_usd"] == pytest.approx(1.6 * 0.9)


def test_the_table_shows_each_replay_and_the_summary(folder: Path) -> None:
    code, out = backtest(
        "--traces", str(folder / "us-west-2b_v100_1.json"), "--work", "1h", "--deadline",
        "2h", "--restart-overhead", "0.1h", "--on-demand-price", "3", "--start", "30m",
        "--strategy", "greedy",
    )  # fmt: skip
    assert code == 0, out
    lines = out.splitlines()
    assert lines[0].startswith("strategy greedy: work 1 h, deadline 2 h, restart 0.1 h")
    assert "optimum $" in lines[1] and "greedy $" in lines[1]
    assert lines[2].split()[:2] == ["us-west-2b_v100_1.json", "0.5"]
    # b has spot from 1 h: greedy waits 30 min, then 1.1 h on spot at 0.3 x on-demand
    assert lines[-1] == "1 replays: mean cost / on-demand 0.300, deadlines missed 0"


def test_a_price_file_gives_both_prices(folder: Path, tmp_path: Path) -> None:
    prices = tmp_path / "prices.csv"
    prices.write_text("market,usd_per_hour\nspot,0.9\non_demand,3\n")
    as_json = tmp_path / "prices.json"
    as_json.write_text('{"spot": 0.9, "on_demand": 3}')
    for path in (prices, as_json):
        code, out = backtest(
            "--traces", str(folder), "--work", "1h", "--deadline", "2h", "--price-file",
            str(path), "--json",
        )  # fmt: skip
        assert code == 0, out
        assert json.loads(out)[0]["on_demand_cost_usd"] == pytest.approx(3.6)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--work", "48"], "--work: '48' is not a duration (e.g. 48h, 30m or 0.2h)"),
        (["--deadline", "soon"], "--deadline: 'soon' is not a duration"),
        (["--strategy", "eager"], "--strategy: unknown 'eager' (known: gpuopt, greedy,"),
        (["--starts", "2", "--start", "1h"], "give --starts N or --start T, not both"),
        (["--start", "100h"], "--start: 100h is past the end of us-east-1a_v100_1.json"),
        (["--nodes", "0"], "--nodes: expected 1 or more"),
        (["--spot-price", "-1"], "--spot-price: expected a price >= 0"),
    ],
)
def test_bad_input_is_one_located_line_and_exit_2(
    folder: Path, args: list[str], message: str
) -> None:
    code, out = backtest("--traces", str(folder), "--on-demand-price", "3", *args)
    assert code == 2 and message in out and "Traceback" not in out


def test_bad_files_are_named(folder: Path, tmp_path: Path) -> None:
    (folder / "us-east-1a_v100_1.json").write_text('{"metadata": {}, "data": [1]}')
    code, out = backtest("--traces", str(folder), "--on-demand-price", "3")
    assert code == 2 and "us-east-1a_v100_1.json: metadata.gap_seconds: missing" in out
    prices = tmp_path / "p.csv"
    prices.write_text("market,usd_per_hour\nspot,cheap\n")
    code, out = backtest("--traces", str(tmp_path / "none"), "--price-file", str(prices))
    assert code == 2 and f"{prices}:2: usd_per_hour: expected a price" in out
    code, out = backtest("--traces", str(folder))
    assert code == 2 and "give --on-demand-price (and --spot-price) or --price-file" in out
    code, out = backtest()
    assert code == 2 and "give the policy YAML (or --traces DIR" in out


PUBLIC = os.environ.get("GPUOPT_SPOT_TRACES")


@pytest.mark.skipif(
    not PUBLIC,
    reason="GPUOPT_SPOT_TRACES names no folder of the public spot traces (aws-02-15-2023)",
)
def test_on_the_public_traces_no_strategy_misses_or_beats_the_optimum() -> None:
    traces = read_traces(Path(str(PUBLIC)))
    job = dict(
        start_tick=2000, work_s=48 * 3600, deadline_s=52 * 3600, overhead_s=720,
        spot_price=0.918, on_demand_price=3.06,
    )  # fmt: skip
    for group in ([traces[0]], traces):
        best = optimum(group, **job)  # type: ignore[arg-type]
        assert best is not None
        for name in ("gpuopt", "greedy", "uniform-progress"):
            out = replay(strategy(name), group, **job)  # type: ignore[arg-type]
            assert out.deadline_met and out.cost_usd >= best - 1e-9
