"""`gpuopt backtest` and `gpuopt advise-bid` on malformed history files: each one is an error
naming the file and the problem (and the line, row or column where there is one), exit code
2, never a traceback. The files are made here: binary data named .csv, text that is not
UTF-8, empty files, Parquet and Arrow IPC files with wrong column types, missing columns,
null times or prices, and times at the edges of the calendar."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from optimizer.catalog import write_catalog
from optimizer.cli import app
from optimizer.jobs.history import history_table
from policies.backtest import History
from tests.helpers import make_offer

T0 = datetime(2026, 3, 2, tzinfo=UTC)
POINTS = [
    make_offer(zone=zone, usd_per_hour=usd + hour, observed_at=T0 + timedelta(hours=hour))
    for hour in range(3)
    for zone, usd in (("use1-az1", 1.0), ("use1-az2", 2.0))
]
POLICY = "apiVersion: gpuopt/v1\nkind: Policy\nname: bt\nmarkets: [spot]\n"
UTC_TIME = pa.timestamp("s", tz="UTC")
YEAR_1 = datetime(1, 1, 1, tzinfo=UTC)
YEAR_9999 = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)


def catalog_text() -> str:
    from io import StringIO

    out = StringIO()
    write_catalog(POINTS, out)
    return out.getvalue()


def csv_with(column: str, value: str, row: int = 1) -> bytes:
    """The catalog CSV with one value replaced (row 1: the first after the header)."""
    lines = catalog_text().splitlines(keepends=True)
    header = lines[0].strip().split(",")
    cells = lines[row].rstrip("\n").split(",")
    cells[header.index(column)] = value
    lines[row] = ",".join(cells) + "\n"
    return "".join(lines).encode("utf-8")


def table_with(column: str, values: Any) -> Any:
    """The history's Arrow table with one column replaced (`values`: a pyarrow array)."""
    table = history_table(History.from_offers(POINTS))
    return table.set_column(table.column_names.index(column), column, values)


def n_of(value: Any, kind: Any = None) -> Any:
    return pa.array([value] * len(POINTS), kind)


# name -> (what the file holds, the words the error must say)
CSV_FILES: dict[str, tuple[Callable[[], bytes], str]] = {
    "garbage.csv": (
        lambda: bytes(random.Random(7).randrange(128, 256) for _ in range(4096)),
        ":1:1: not UTF-8 text",
    ),
    "nul_and_garbage.csv": (lambda: b"\x00\x01\x02\xff\xfe" * 100, "not UTF-8 text"),
    "latin1.csv": (
        lambda: catalog_text().replace("A10G", "A10G\xe9", 1).encode("latin-1"),
        ":2:",
    ),
    "empty.csv": (lambda: b"", "empty file"),
    "comments_only.csv": (lambda: b"# nothing here\n\n", "empty file"),
    "header_only.csv": (
        lambda: catalog_text().splitlines(keepends=True)[0].encode(),
        "no price points",
    ),
    "no_price_column.csv": (
        lambda: catalog_text().replace("usd_per_hour", "price").encode(),
        "usd_per_hour",
    ),
    "year_1_ahead.csv": (lambda: csv_with("observed_at", "0001-01-01T00:00:00+14:00"), ":2:"),
    "year_9999_behind.csv": (
        lambda: csv_with("observed_at", "9999-12-31T23:59:59-14:00"),
        "observed_at",
    ),
    "year_1.csv": (lambda: csv_with("observed_at", "0001-01-01T00:00:00Z"), "1970-01-01"),
    "year_9999.csv": (lambda: csv_with("observed_at", "9999-12-31T23:59:59Z"), "2200-01-01"),
    "no_time.csv": (lambda: csv_with("observed_at", ""), "observed_at: missing value"),
    "bad_time.csv": (lambda: csv_with("observed_at", "soon"), "observed_at"),
    "nan_price.csv": (lambda: csv_with("usd_per_hour", "nan"), "usd_per_hour"),
    "short_row.csv": (lambda: catalog_text().encode() + b"aws,us-east-1\n", "values"),
}
TYPED_TABLES: dict[str, tuple[Callable[[], Any], str]] = {
    "price_as_text": (lambda: table_with("usd_per_hour", n_of("cheap")), "usd_per_hour"),
    "time_as_text": (lambda: table_with("observed_at", n_of("soon")), "observed_at"),
    "count_as_nan": (lambda: table_with("gpu_count", n_of(float("nan"))), "gpu_count"),
    "region_as_lists": (lambda: table_with("region", n_of([1])), "region"),
    "no_price_column": (
        lambda: history_table(History.from_offers(POINTS)).drop(["usd_per_hour"]),
        "usd_per_hour",
    ),
    "null_times": (
        lambda: table_with("observed_at", n_of(None, UTC_TIME)),
        "observed_at: row 1: missing value",
    ),
    "null_prices": (lambda: table_with("usd_per_hour", n_of(None, pa.float64())), "row 1"),
    "null_provider": (lambda: table_with("provider", n_of(None, pa.string())), "row 1"),
    "times_in_year_1": (lambda: table_with("observed_at", n_of(YEAR_1, UTC_TIME)), "1970"),
    "times_in_year_9999": (lambda: table_with("observed_at", n_of(YEAR_9999, UTC_TIME)), "2200"),
    "times_past_9999": (
        lambda: table_with(
            "observed_at", n_of(2**62, pa.int64()).cast(pa.timestamp("ms", tz="UTC"))
        ),
        "observed_at",
    ),
    "no_rows": (lambda: history_table(History.from_offers(POINTS)).slice(0, 0), "no price"),
}
RAW_TYPED: dict[str, tuple[Callable[[], bytes], str]] = {
    "garbage.parquet": (lambda: os.urandom(4096), "not a history"),
    "garbage.arrow": (lambda: os.urandom(4096), "not a history"),
    "empty.parquet": (lambda: b"", "not a history"),
    "empty.feather": (lambda: b"", "not a history"),
    "a_csv_named.parquet": (lambda: catalog_text().encode(), "not a history"),
}


def write_case(folder: Path, name: str) -> tuple[Path, str]:
    """The named malformed file written into `folder`, and the words its error must say."""
    if name in CSV_FILES or name in RAW_TYPED:
        make, says = CSV_FILES.get(name) or RAW_TYPED[name]
        path = folder / name
        path.write_bytes(make())
        return path, says
    stem, suffix = name.rsplit(".", 1)
    make_table, says = TYPED_TABLES[stem]
    table = make_table()
    path = folder / name
    if suffix == "parquet":
        pq.write_table(table, path)
    else:
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as out:
            out.write_table(table)
    return path, says


def arrow_stream(folder: Path) -> Path:
    """An Arrow IPC *stream* (not the file format) named .arrow."""
    table = history_table(History.from_offers(POINTS))
    path = folder / "stream.arrow"
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as out:
        out.write_table(table)
    return path


CASES = [
    *CSV_FILES,
    *RAW_TYPED,
    *(f"{stem}.{suffix}" for stem in TYPED_TABLES for suffix in ("parquet", "arrow")),
]


@pytest.fixture
def policy_file(tmp_path: Path) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY, encoding="utf-8")
    return path


@pytest.mark.parametrize("command", ["backtest", "advise-bid"])
@pytest.mark.parametrize("name", CASES)
def test_a_malformed_history_is_one_located_error_and_exit_2(
    tmp_path: Path, policy_file: Path, name: str, command: str
) -> None:
    history, says = write_case(tmp_path, name)
    run = CliRunner().invoke(app, [command, str(policy_file), "--history", str(history)])
    assert isinstance(run.exception, SystemExit), run.exception  # not an exception let out
    assert run.exit_code == 2, run.output
    assert "Traceback" not in run.output
    [line] = [x for x in run.output.splitlines() if x.startswith("gpuopt: error: ")]
    assert str(history) in line and says in line, line


def test_an_arrow_stream_named_arrow_is_not_a_history(tmp_path: Path, policy_file: Path) -> None:
    history = arrow_stream(tmp_path)
    run = CliRunner().invoke(app, ["backtest", str(policy_file), "--history", str(history)])
    assert run.exit_code == 2 and f"{history}: not a history" in run.output


@pytest.mark.parametrize("option", ["--since", "--until"])
@pytest.mark.parametrize("when", ["0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00"])
def test_times_at_the_calendars_edge_on_the_command_line_are_an_error(
    tmp_path: Path, policy_file: Path, option: str, when: str
) -> None:
    history = tmp_path / "good.csv"
    history.write_text(catalog_text(), encoding="utf-8")
    run = CliRunner().invoke(
        app, ["advise-bid", str(policy_file), "--history", str(history), option, when]
    )
    assert run.exit_code == 2 and isinstance(run.exception, SystemExit)
    assert f"{option}: must be between 1970-01-01 and 2200-01-01 UTC" in run.output


def test_a_history_of_free_offers_advises_the_smallest_cap(
    tmp_path: Path, policy_file: Path
) -> None:
    free = tmp_path / "free.csv"
    with free.open("w", encoding="utf-8", newline="") as stream:
        write_catalog([make_offer(usd_per_hour=0.0, observed_at=T0)], stream)
    run = CliRunner().invoke(app, ["advise-bid", str(policy_file), "--history", str(free)])
    assert run.exit_code == 0, run.output
    assert "max_usd_per_hour=0.0001" in run.output


@pytest.mark.parametrize("name", ["garbage.csv", "null_times.parquet", "times_in_year_9999.arrow"])
def test_the_gpuopt_process_prints_no_traceback(
    tmp_path: Path, policy_file: Path, name: str
) -> None:
    history, says = write_case(tmp_path, name)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "optimizer.cli",
            "backtest",
            str(policy_file),
            "--history",
            str(history),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.startswith(f"gpuopt: error: {history}") and says in done.stderr


def test_times_with_fractions_of_a_second_as_gpuopt_writes_them_are_read(
    tmp_path: Path, policy_file: Path
) -> None:
    """`prices export` and the store write times with microseconds: a history holding them
    replays exactly like one whose times are whole seconds (they are floored to the second)."""
    whole, fractional = tmp_path / "whole.csv", tmp_path / "fractional.csv"
    whole.write_text(catalog_text())
    fractional.write_text(
        catalog_text()
        .replace("T00:00:00Z", "T00:00:00.250000+00:00")
        .replace("T01:00:00Z", "T01:00:00.999999Z")
    )
    assert ".250000+00:00" in fractional.read_text()
    runner = CliRunner()
    for command in ("backtest", "advise-bid"):
        answers = [
            runner.invoke(app, [command, str(policy_file), "--history", str(f), "--json"])
            for f in (whole, fractional)
        ]
        assert [a.exit_code for a in answers] == [0, 0], [a.output for a in answers]
        assert answers[0].output == answers[1].output


def test_a_bad_value_is_named_by_file_line_and_column_without_arrows_words(
    tmp_path: Path, policy_file: Path
) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_bytes(b"# exported\n" + csv_with("observed_at", "2026-03-02 noon", row=2))
    result = CliRunner().invoke(app, ["backtest", str(policy_file), "--history", str(bad)])
    assert result.exit_code == 2
    header = catalog_text().splitlines()[0].split(",")
    column = header.index("observed_at") + 1
    assert f"{bad}:4:{column}: observed_at: '2026-03-02 noon' is not a time" in result.output
    assert "CSV conversion" not in result.output and "Row #" not in result.output
