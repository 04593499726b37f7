"""`gpuopt policy windows` and `gpuopt offers --policy --at`, as users run them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CATALOG = """\
provider,region,zone,instance_type,gpu_model,gpu_count,gpu_memory_gib,vcpus,ram_gib,interconnect,market,usd_per_hour,observed_at
aws,eu-west-1,euw1-az1,p4d.24xlarge,A100-40GB,8,40.0,96,1152,nvlink,spot,9.5,2026-11-01T00:00:00Z
aws,us-east-1,use1-az2,p4de.24xlarge,A100-80GB,8,80.0,96,1152,nvlink,on_demand,40.96,2026-11-01T00:00:00Z
gcp,europe-west4,europe-west4-a,a2-ultragpu-1g,A100-80GB,1,80.0,12,170,none,spot,2.1,2026-11-01T00:00:00Z
"""

POLICY = """\
apiVersion: gpuopt/v1
kind: Policy
name: team
workload: {gpus: 1, gpu_memory_gib: 30}
markets: [spot, on_demand]
schedule:
  timezone: Europe/Berlin
  windows:
    - name: office-hours
      days: [mon, tue, wed, thu, fri]
      hours: "09:00-18:00"
      markets: [on_demand]
      bid: {max_usd_per_hour: 50}
    - name: night
      days: [fri]
      hours: "22:00-06:00"
      rank_by: expected_cost
"""


def gpuopt(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    return subprocess.run(
        [sys.executable, "-m", "optimizer.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    catalog, policy = tmp_path / "prices.csv", tmp_path / "team.yaml"
    catalog.write_text(CATALOG)
    policy.write_text(POLICY)
    return catalog, policy


def test_policy_windows_prints_the_coming_transitions_with_what_they_change(
    files: tuple[Path, Path],
) -> None:
    _, policy = files
    # Friday 27 March 2026, noon in Berlin; summer time starts on Sunday the 29th.
    args = ("policy", "windows", str(policy), "--from", "2026-03-27T12:00:00+01:00", "--days", "3")
    done = gpuopt(*args, "--json")
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["window"] == "office-hours"
    assert [(t["at"], t["before"], t["after"]) for t in plan["transitions"]] == [
        ("2026-03-27T17:00:00Z", "office-hours", None),
        ("2026-03-27T21:00:00Z", None, "night"),
        ("2026-03-28T05:00:00Z", "night", None),
        ("2026-03-30T07:00:00Z", None, "office-hours"),  # 09:00 CEST
    ]
    assert plan["transitions"][0]["changes"] == [
        {"key": "markets", "before": "[on_demand]", "after": "[spot, on_demand]"},
        {"key": "bid", "before": "{max_usd_per_hour: 50}", "after": "{}"},
    ]
    text = gpuopt(*args)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0] == (
        "policy team, times in Europe/Berlin; at Fri 2026-03-27 12:00 CET: office-hours"
    )
    assert lines[2] == (
        "Fri 2026-03-27 22:00 CET  (no window) -> night: rank_by price -> expected_cost"
    )
    assert lines[4].startswith("Mon 2026-03-30 09:00 CEST  (no window) -> office-hours: ")


def test_offers_at_an_instant_rank_under_the_window_in_force_then(
    files: tuple[Path, Path],
) -> None:
    catalog, policy = files
    base = ("offers", "--catalog", str(catalog), "--policy", str(policy), "--json")
    office = gpuopt(*base, "--at", "2026-12-01T10:00:00+01:00")
    assert office.returncode == 0, office.stderr
    ranking = json.loads(office.stdout)
    assert ranking["window"] == "office-hours" and ranking["at"] == "2026-12-01T09:00:00Z"
    assert [c["offer"]["instance_type"] for c in ranking["candidates"]] == ["p4de.24xlarge"]
    saturday = json.loads(gpuopt(*base, "--at", "2026-12-05T10:00:00Z").stdout)
    assert saturday["window"] is None
    assert [c["offer"]["instance_type"] for c in saturday["candidates"]] == [
        "a2-ultragpu-1g",
        "p4d.24xlarge",
        "p4de.24xlarge",
    ]
    table = gpuopt(*base[:-1], "--at", "2026-12-01T10:00:00+01:00")
    assert "Ranked under schedule window office-hours, in force at 2026-12-01T09:00:00Z." in (
        table.stdout
    )


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("--at", "2026-12-01T10:00:00"), "--at '2026-12-01T10:00:00': give a UTC offset"),
        (("--at", "tomorrow"), "--at 'tomorrow': not an ISO 8601 time"),
    ],
)
def test_a_bad_at_is_refused_in_one_line(
    files: tuple[Path, Path], extra: tuple[str, ...], message: str
) -> None:
    catalog, policy = files
    done = gpuopt("offers", "--catalog", str(catalog), "--policy", str(policy), *extra)
    assert done.returncode == 2
    assert done.stderr.startswith(f"gpuopt: error: {message}")


def test_at_needs_a_policy(files: tuple[Path, Path]) -> None:
    catalog, _ = files
    done = gpuopt("offers", "--catalog", str(catalog), "--at", "2026-12-01T10:00:00Z")
    assert done.returncode == 2 and "--at needs --policy" in done.stderr


def test_policy_windows_on_an_overlapping_schedule_exits_2_with_the_location(
    tmp_path: Path,
) -> None:
    policy = tmp_path / "team.yaml"
    policy.write_text(POLICY.replace('"22:00-06:00"', '"17:00-06:00"'))
    done = gpuopt("policy", "windows", str(policy))
    assert done.returncode == 2
    assert done.stderr.startswith(
        f"gpuopt: error: {policy}:16:14: schedule.windows[1].hours: window 'night' overlaps "
        "window 'office-hours' (windows[0]): fri 17:00 to sat 06:00 meets fri 09:00 to fri 18:00"
    )
