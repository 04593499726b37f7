"""`gpuopt daemon` says what it does with jobs: every event of a job (submitted, launched,
running, interrupted, relaunched, succeeded) is one INFO line in its log, with the job, the
attempt, the instance and the reason, as `key=value` text or as one JSON object, and no
secret of the job's or the daemon's ever reaches it. A real daemon on the local cloud."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import DaemonProcess, run_gpuopt, wait_until, write_policy

pytestmark = pytest.mark.usefixtures("daemon_env")

ROOT = Path(__file__).resolve().parents[1]
POLICY = ROOT / "examples" / "local-train-policy.yaml"  # local-train: the local cloud, EU only
SECRET = "job-secret-0c6f9b2e7d41"
# A job event's line, at its severity's level (INFO, WARNING for job.interrupted, ERROR).
EVENT_LINE = " optimizer.daemon.eventlog: "
PAIR = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)')


def job_body(tmp_path: Path, run: str) -> dict[str, Any]:
    return {
        "name": "logged",
        "policy": "local-train",
        "run": run,
        "checkpoint": f"file://{tmp_path / 'bucket'}",
        "probes": "none",
        "env": {"API_KEY": SECRET},
    }


def job_state(daemon: DaemonProcess) -> str:
    with daemon.client() as client:
        return str(client.get("/jobs/logged").json()["state"])


def submit(daemon: DaemonProcess, body: dict[str, Any]) -> None:
    with daemon.client() as client:
        client.post("/jobs", json=body).raise_for_status()


def parse(line: str) -> dict[str, Any]:
    """A text event line's fields (quoted values decoded, numbers as ints)."""
    text = line.split(EVENT_LINE, 1)[1]
    fields: dict[str, Any] = {}
    for key, raw in PAIR.findall(text):
        value = json.loads(raw) if raw.startswith('"') else raw
        fields[key] = int(value) if key in ("event_id", "attempt") else value
    assert " ".join(f"{k}={r}" for k, r in PAIR.findall(text)) == text, text
    return fields


def test_the_text_log_follows_a_job_across_an_interruption(tmp_path: Path) -> None:
    data = tmp_path / "data"
    write_policy(data / "policies", "local-train.yaml", POLICY.read_text())
    daemon = DaemonProcess(data)
    try:
        # Attempt 1 runs until it is stopped; attempt 2 finishes at once.
        submit(daemon, job_body(tmp_path, 'test "$GPUOPT_ATTEMPT" != 1 || exec sleep 300'))
        wait_until(lambda: job_state(daemon) == "running", 60, "attempt 1 running")
        interrupted = run_gpuopt(data, "local", "interrupt", "i-local-0001")
        assert interrupted.returncode == 0, interrupted.stderr
        wait_until(lambda: job_state(daemon) == "succeeded", 120, "the job to succeed")
    finally:
        daemon.stop()
    log = daemon.log.read_text()
    assert SECRET not in log and daemon.token not in log
    events = [parse(line) for line in log.splitlines() if EVENT_LINE in line]
    assert all(e["job"] == "logged" and e["policy"] == "local-train" for e in events)
    assert events[0]["event"] == "job.submitted" and "attempt" not in events[0]

    def seen(event: str, **fields: Any) -> list[dict[str, Any]]:
        return [e for e in events if e["event"] == event and fields.items() <= e.items()]

    first = {"attempt": 1, "instance": "i-local-0001"}
    second = {"attempt": 2, "instance": "i-local-0002"}
    [launched] = seen("job.state_changed", **first, to="provisioning")
    assert launched["from"] == "pending" and launched["reason"].startswith("launched attempt 1 ")
    assert seen("job.state_changed", **first, to="running")
    [notice] = seen("job.interrupted", **first)
    assert notice["severity"] == "warning"
    assert notice["reason"].startswith("spot capacity reclaimed on local ")
    [relaunched] = seen("job.state_changed", **second, to="provisioning")
    assert relaunched["from"] == "running" and "relaunching (restart 1)" in relaunched["reason"]
    assert seen("job.succeeded", **second)
    assert events[-1] == {**events[-1], **second, "event": "job.state_changed", "to": "succeeded"}
    ids = [e["event_id"] for e in events]
    assert ids == sorted(set(ids))  # each event once, in the order recorded


def test_the_json_log_has_one_object_per_event_with_the_events_api_ids(tmp_path: Path) -> None:
    data = tmp_path / "data"
    write_policy(data / "policies", "local-train.yaml", POLICY.read_text())
    daemon = DaemonProcess(data, "--log-format", "json")
    try:
        submit(daemon, job_body(tmp_path, "true"))
        wait_until(lambda: job_state(daemon) == "succeeded", 60, "the job to succeed")
        with daemon.client() as client:
            recorded = client.get("/events", params={"job": "logged"}).json()["events"]
    finally:
        daemon.stop()
    log = daemon.log.read_text()
    assert SECRET not in log and daemon.token not in log
    entries = [json.loads(line) for line in log.splitlines() if line.strip()]
    logged = [e for e in entries if e["logger"] == "optimizer.daemon.eventlog"]
    assert all(e["level"] == "info" for e in logged)
    assert {e["event_id"]: e["event"] for e in logged} == {e["id"]: e["kind"] for e in recorded}
    done = logged[-1]
    assert (done["event"], done["to"], done["reason"]) == (
        "job.state_changed",
        "succeeded",
        "job exited 0",
    )
    assert (done["attempt"], done["instance"]) == (1, "i-local-0001")
    assert done["msg"].startswith(f"event=job.state_changed event_id={done['event_id']} ")
