"""Tables that fit a terminal (optimizer/cli/render.py): at a width, the least important
columns go first, then long text is shortened with an ellipsis, key columns (names, prices)
never; a note says what was hidden; piped output fits COLUMNS when set, else is wide."""

from __future__ import annotations

import io

import pytest

from optimizer.cli.render import Column, columns, fit, render_lines, table, target_width

COLUMNS = [
    Column("NAME", key=True),
    Column("ZONE", drop=3),
    Column("TYPE", key=True),
    Column("VCPUS", right=True, drop=5),
    Column("MARKET", drop=1),
    Column("$/h", right=True, key=True),
    Column("DETAIL", cut=True, drop=0),
]
ROWS = [
    [
        "train-resnet-50",
        "europe-west4-a",
        "p4de.24xlarge",
        "96",
        "on_demand",
        "40.9657",
        "interrupted: power-off at 2026-12-04 23:10:00 UTC after a spot notice",
    ],
    ["a", "us-east-1a", "g5.xlarge", "4", "spot", "0.4012", "-"],
]
WIDE = [
    "NAME             ZONE            TYPE           VCPUS  MARKET         $/h  DETAIL",
    "train-resnet-50  europe-west4-a  p4de.24xlarge     96  on_demand  40.9657  interrupted:"
    " power-off at 2026-12-04 23:10:00 UTC after a spot notice",
    "a                us-east-1a      g5.xlarge          4  spot        0.4012  -",
]


def test_with_no_width_every_column_is_shown_uncut() -> None:
    assert render_lines(COLUMNS, ROWS, width=None) == WIDE


def test_at_120_columns_the_text_is_shortened_before_a_column_goes() -> None:
    lines = render_lines(COLUMNS, ROWS, width=120)
    assert all(len(line) <= 120 for line in lines)
    assert lines[0].split() == ["NAME", "ZONE", "TYPE", "VCPUS", "MARKET", "$/h", "DETAIL"]
    assert lines[1].startswith(WIDE[1][:75]) and lines[1].endswith("…")
    assert len(lines[1]) == 120
    assert lines[-1] == "(long text shortened with …; -o wide shows all)"


def test_at_80_columns_the_least_important_go_first_and_keys_stay_whole() -> None:
    lines = render_lines(COLUMNS, ROWS, width=80)
    assert all(len(line) <= 80 for line in lines), lines
    # VCPUS (drop 5) goes, and then DETAIL shortened to its least (12) fits: ZONE stays.
    assert lines[0].split() == ["NAME", "ZONE", "TYPE", "MARKET", "$/h", "DETAIL"]
    assert lines[1].split()[:5] == [
        "train-resnet-50", "europe-west4-a", "p4de.24xlarge", "on_demand", "40.9657",
    ]  # fmt: skip
    assert lines[1].endswith("interrupted…") and len(lines[1]) == 80
    assert lines[2].split() == ["a", "us-east-1a", "g5.xlarge", "spot", "0.4012", "-"]
    assert " ".join(lines[3:]) == (
        "(1 column hidden to fit 80 columns: VCPUS; long text shortened with …; -o wide shows all)"
    )
    # At 60 the zone goes too (drop 3), then MARKET (drop 1); DETAIL (drop 0) is shortened.
    narrow = render_lines(COLUMNS, ROWS, width=60)
    assert narrow[0].split() == ["NAME", "TYPE", "$/h", "DETAIL"]
    assert " ".join(narrow[3:]).startswith("(3 columns hidden to fit 60 columns: ZONE, VCPUS, ")
    assert all(len(line) <= 60 for line in narrow) and "40.9657" in narrow[1]


def test_key_columns_are_never_cut_even_past_the_edge() -> None:
    lines = render_lines(COLUMNS, ROWS, width=30)
    assert lines[0].split() == ["NAME", "TYPE", "$/h"]  # every other column dropped
    assert lines[1].split() == ["train-resnet-50", "p4de.24xlarge", "40.9657"]  # 40 wide


def test_a_cut_column_keeps_its_least_width_and_its_header() -> None:
    spec = [Column("NAME", key=True), Column("PLACEMENT", cut=True, least=20, drop=0)]
    rows = [["x", "aws us-east-1a g5.xlarge (starting)"]]
    fitted = fit(spec, rows, 26)
    assert fitted.widths == [4, 20] and fitted.hidden == [] and fitted.cut
    assert fit(spec, rows, 25).hidden == ["PLACEMENT"]  # narrower than its least: it goes
    lines = render_lines(spec, rows, width=26)
    assert lines[1] == "x     aws us-east-1a g5.x…"


def test_a_title_a_footer_and_cells_of_several_lines() -> None:
    spec = [Column("rule", key=True), Column("n", right=True, key=True), Column("examples")]
    rows = [["gpu", "12", "a: too small\nb: too old"]]
    lines = render_lines(spec, rows, width=None, title="Rejected", footer=[["total", "12", ""]])
    assert lines == [
        "Rejected",
        "rule    n  examples",
        "gpu    12  a: too small",
        "           b: too old",
        "-" * 23,
        "total  12",
    ]


def test_piped_output_honours_columns_or_is_wide(monkeypatch: pytest.MonkeyPatch) -> None:
    piped = io.StringIO()
    monkeypatch.delenv("COLUMNS", raising=False)
    assert target_width(stream=piped) is None
    table(COLUMNS, ROWS, out=piped)
    assert piped.getvalue().splitlines() == WIDE
    monkeypatch.setenv("COLUMNS", "80")
    assert target_width(stream=piped) == 80
    assert target_width(stream=piped, wide=True) is None
    fitted = io.StringIO()
    table(COLUMNS, ROWS, out=fitted)
    assert fitted.getvalue().splitlines() == render_lines(COLUMNS, ROWS, width=80)
    wide = io.StringIO()
    table(COLUMNS, ROWS, out=wide, wide=True)
    assert wide.getvalue().splitlines() == WIDE


def test_columns_keeps_its_plain_form(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`columns(headers, rows, right=[...])`: the first column a key, the last shortened,
    the others dropped from the right."""
    monkeypatch.setenv("COLUMNS", "40")
    columns(
        ["ID", "STATE", "ZONE", "$/h", "NOTE"],
        [["i-0abc", "running", "us-east-1a", "0.4000", "a note that runs long"]],
        right=["$/h"],
        keys=["$/h"],
    )
    assert capsys.readouterr().out.splitlines() == [
        "ID      STATE       $/h  NOTE",
        "i-0abc  running  0.4000  a note that ru…",
        "(1 column hidden to fit 40 columns:",
        "ZONE; long text shortened with …;",
        "-o wide shows all)",
    ]
