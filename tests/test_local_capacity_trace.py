"""The local cloud's spot capacity following an availability trace (providers/local/trace.py,
`gpuopt local capacity --trace`): launches past the count are refused, and when the count
drops below the running spot instances the newest get the normal interruption notice."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from optimizer.clock import ManualClock
from optimizer.model import Offer
from providers.base import CapacityError, LaunchSpec
from providers.local import LocalCloud
from providers.local import market as controls
from providers.local.market import pool_name
from providers.local.trace import TraceError, read_trace
from tests.helpers import T0, local_cloud, run_gpuopt, wait_until

SPOT = "g4dn.xlarge@eu-central-1-a"
OTHER_SPOT = "g4dn.xlarge@eu-central-1-b"
ON_DEMAND = "g4dn.xlarge@eu-central-1"


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


@pytest.fixture
def cloud(tmp_path: Path, clock: ManualClock) -> Iterator[LocalCloud]:
    with local_cloud(
        tmp_path / "local-cloud", tick_s=0.05, clock=lambda: clock().timestamp()
    ) as local:
        yield local


def write_trace(path: Path, counts: list[int], gap_s: float = 3600) -> Path:
    path.write_text(json.dumps({"metadata": {"gap_seconds": gap_s}, "data": counts}))
    return path


def offer_of(cloud: LocalCloud, name: str) -> Offer:
    return next(o for o in cloud.fetch_offers(["eu-central-1"]) if pool_name(o) == name)


def launch(cloud: LocalCloud, name: str, key: str) -> str:
    spec = LaunchSpec(job=key, attempt=1, bootstrap="sleep 60")
    return cloud.launch(offer_of(cloud, name), spec, key).instance_id


def interrupted(cloud: LocalCloud) -> set[str]:
    return {r.id for r in cloud.instances() if r.interruption is not None}


def test_reading_a_trace_rescales_its_tick_and_names_the_file_in_errors(tmp_path: Path) -> None:
    trace = read_trace(write_trace(tmp_path / "us-east-1a_v100_1.json", [1, 0, 2]), tick_s=5)
    assert trace.counts == (1, 0, 2) and trace.tick_s == 5 and trace.span_s == 15
    assert read_trace(tmp_path / "us-east-1a_v100_1.json").tick_s == 3600
    for doc, said in (
        ({"data": [1]}, "metadata.gap_seconds: missing"),
        (
            {"metadata": {"gap_seconds": 0}, "data": [1]},
            "metadata.gap_seconds: expected a positive",
        ),
        ({"metadata": {"gap_seconds": 60}, "data": []}, "data: empty"),
        ({"metadata": {"gap_seconds": 60}, "data": [1, -1]}, r"data\[1\]: expected a whole count"),
    ):
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps(doc))
        with pytest.raises(TraceError, match=f"bad.json: {said}"):
            read_trace(bad)
    (tmp_path / "text.json").write_text("not json")
    with pytest.raises(TraceError, match=r"text\.json: line 1: not JSON"):
        read_trace(tmp_path / "text.json")


def test_capacity_follows_the_trace_refusing_launches_and_interrupting_the_newest(
    tmp_path: Path, cloud: LocalCloud, clock: ManualClock
) -> None:
    # Ticks of an hour in the file, ten seconds each here: 2, then 1, then 0, then 3.
    trace = read_trace(write_trace(tmp_path / "t.json", [2, 1, 0, 3]), tick_s=10)
    cloud.follow_trace(trace, SPOT)
    first = launch(cloud, SPOT, "a")
    clock.advance(1)
    second = launch(cloud, SPOT, "b")
    with pytest.raises(CapacityError, match=r"t\.json: 2 spot instance"):
        launch(cloud, SPOT, "c")
    launch(cloud, OTHER_SPOT, "d")  # another pool follows no trace
    launch(cloud, ON_DEMAND, "e")  # nor does on-demand

    clock.advance(9)  # the count drops to 1: the newest instance gets the notice
    assert wait_until(lambda: interrupted(cloud), 10, "an interruption") == {second}
    clock.advance(10)  # to 0: the other one too
    assert wait_until(lambda: first in interrupted(cloud), 10, "the second interruption")
    clock.advance(10)  # to 3, and the last count holds after the trace ends
    clock.advance(3600)
    for key in ("f", "g", "h"):
        launch(cloud, SPOT, key)
    with pytest.raises(CapacityError):
        launch(cloud, SPOT, "i")


def test_gpuopt_local_capacity_trace_reaches_the_running_cloud(
    tmp_path: Path, cloud: LocalCloud, clock: ManualClock
) -> None:
    path = write_trace(tmp_path / "us-east-1a_v100_1.json", [0, 1])
    done = run_gpuopt(tmp_path, "local", "capacity", "--trace", str(path), "--tick", "30")
    assert done.returncode == 0, done.stderr
    assert "every spot pool: spot capacity follows us-east-1a_v100_1.json (2 ticks of 30 s" in (
        done.stdout
    )
    # The running cloud starts the trace's clock when it first sees it.
    wait_until(
        lambda: all(t.start is not None for t in controls.load(cloud.state).traces.values()),
        10,
        "the trace's start",
    )
    with pytest.raises(CapacityError):
        launch(cloud, OTHER_SPOT, "a")
    clock.advance(30)
    launch(cloud, OTHER_SPOT, "a")

    stopped = run_gpuopt(tmp_path, "local", "capacity", "--no-trace")
    assert stopped.returncode == 0, stopped.stderr
    assert controls.load(cloud.state).traces == {}

    for args, said in (
        (("--trace", str(tmp_path / "none.json")), "none.json: cannot read"),
        (("--trace", str(path), "--pool", ON_DEMAND), "is an on-demand pool"),
        (("--tick", "5", "--no-trace"), "--tick goes with --trace"),
    ):
        failed = run_gpuopt(tmp_path, "local", "capacity", *args)
        assert failed.returncode == 2 and said in failed.stderr, failed.stderr
