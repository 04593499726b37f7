"""Reading spot traces in the public format: zones from file names, located errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from policies.deadline import TraceError, read_traces


def write(folder: Path, name: str, body: object) -> Path:
    path = folder / name
    path.write_text(body if isinstance(body, str) else json.dumps(body))
    return path


def test_a_folder_reads_every_json_trace_sorted_with_its_zone_and_tick(tmp_path: Path) -> None:
    write(tmp_path, "us-west-2b_v100_1.json", {"metadata": {"gap_seconds": 195}, "data": [0, 1]})
    write(tmp_path, "us-east-1a_v100_1.json", {"metadata": {"gap_seconds": 195}, "data": [2]})
    write(tmp_path, "notes.txt", "not a trace")
    traces = read_traces(tmp_path)
    assert [(t.name, t.zone, t.gap_s, t.counts) for t in traces] == [
        ("us-east-1a_v100_1.json", "us-east-1a", 195.0, (2,)),
        ("us-west-2b_v100_1.json", "us-west-2b", 195.0, (0, 1)),
    ]


def test_a_preemption_trace_reads_the_same_and_its_prices_are_ignored(tmp_path: Path) -> None:
    body = {"metadata": {"gap_seconds": 32}, "data": [0, 1, 1], "prices": [0.918] * 3}
    (trace,) = read_traces(write(tmp_path, "us-east-1c_v100_1.json", body))
    assert trace.counts == (0, 1, 1) and trace.gap_s == 32.0


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ("{not json", "line 1: not JSON"),
        ([1, 2], "expected an object"),
        ({"data": [1]}, "metadata.gap_seconds: missing"),
        ({"metadata": {"gap_seconds": 0}, "data": [1]}, "gap_seconds: expected a positive"),
        ({"metadata": {"gap_seconds": 60}}, "data: missing or not a list"),
        ({"metadata": {"gap_seconds": 60}, "data": []}, "data: empty"),
        ({"metadata": {"gap_seconds": 60}, "data": [1, "x"]}, "data[1]: expected a count"),
        ({"metadata": {"gap_seconds": 60}, "data": [1, -1]}, "data[1]: expected a whole count"),
        ({"metadata": {"gap_seconds": 60}, "data": [0.5]}, "data[0]: expected a whole count"),
    ],
)
def test_a_bad_trace_names_the_file_and_what_is_wrong(
    tmp_path: Path, body: object, problem: str
) -> None:
    path = write(tmp_path, "z_v100_1.json", body)
    with pytest.raises(TraceError) as caught:
        read_traces(path)
    assert str(caught.value).startswith(f"{path}: ") and problem in str(caught.value)


def test_a_missing_path_and_an_empty_folder_are_named(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="no such file or folder"):
        read_traces(tmp_path / "nope")
    with pytest.raises(TraceError, match=r"no \*\.json trace files"):
        read_traces(tmp_path)
