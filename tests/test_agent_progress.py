"""The agent's side of progress (docs/progress.md): the tail of the job's progress file (new
complete lines only, the newest report queued once, malformed lines skipped with a warning, a
large file read from near its end), and the real agent running a job that reports through the
helper, in-process with a scripted daemon: the reports reach the daemon, the last before the
job's exit."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import pytest

from optimizer.agent import Agent, AgentConfig
from optimizer.agent.progress import TAIL_BYTES, ProgressTail
from optimizer.agent.reporter import EventQueue
from optimizer.common.retry import Backoff
from optimizer.progress import Report
from tests.helpers.agent_loop import ScriptedDaemon, ScriptedWatcher


def progress_events(queue: EventQueue) -> list[dict[str, Any]]:
    return [e.data for e in queue.pending(1000) if e.kind == "progress"]


def test_the_newest_report_is_queued_once_and_replaces_an_unsent_one(tmp_path: Path) -> None:
    path = tmp_path / "progress.jsonl"
    queue = EventQueue()
    tail = ProgressTail(path, queue)
    assert tail.poll() is None  # no file yet: nothing, no error
    path.write_text('{"step": 1, "total": 10}\n{"step": 2, "total": 10}\n')
    assert tail.poll() == Report(2, 10)
    assert progress_events(queue) == [{"step": 2, "total": 10}]
    assert tail.poll() is None  # nothing new written
    with path.open("a") as f:
        f.write('{"step": 5, "total": 10}\n')
    tail.poll()
    assert progress_events(queue) == [{"step": 5, "total": 10}]  # the unsent one replaced


def test_a_line_is_read_once_the_job_has_finished_writing_it(tmp_path: Path) -> None:
    path = tmp_path / "progress.jsonl"
    queue = EventQueue()
    tail = ProgressTail(path, queue)
    path.write_text('{"step": 3}\n{"step": 4')
    assert tail.poll() == Report(3)
    with path.open("a") as f:
        f.write(', "total": 9}\n')
    assert tail.poll() == Report(4, 9)


def test_malformed_lines_are_skipped_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "progress.jsonl"
    path.write_text('{"step": 7}\nstep 8\n\n{"step": -1}\n')
    queue = EventQueue()
    tail = ProgressTail(path, queue)
    with caplog.at_level(logging.WARNING, logger="optimizer.agent.progress"):
        assert tail.poll() == Report(7)
    assert tail.skipped == 2
    assert "skipped malformed line 2 of the progress file" in caplog.text
    assert "not JSON" in caplog.text and "step must be between 0 and 2**62, not -1" in caplog.text
    assert progress_events(queue) == [{"step": 7}]


def test_a_large_file_met_first_is_read_from_near_its_end(tmp_path: Path) -> None:
    path = tmp_path / "progress.jsonl"
    with path.open("w") as f:
        for step in range(20_000):  # ~ 300 KiB, past TAIL_BYTES
            f.write(f'{{"step": {step}, "total": 20000}}\n')
    assert path.stat().st_size > TAIL_BYTES
    tail = ProgressTail(path, EventQueue())
    assert tail.poll() == Report(19_999, 20_000)
    assert tail.skipped == 0  # the line cut where reading began is not a malformed one


def test_a_file_replaced_by_a_shorter_one_is_read_again(tmp_path: Path) -> None:
    path = tmp_path / "progress.jsonl"
    path.write_text('{"step": 100}\n{"step": 200}\n')
    tail = ProgressTail(path, EventQueue())
    assert tail.poll() == Report(200)
    path.write_text('{"step": 5}\n')
    assert tail.poll() == Report(5)


# Reports its progress through the helper, with a line the agent must skip, then ends.
JOB = """
import os, time
from optimizer.progress import report
print("progress file", os.environ["GPUOPT_PROGRESS_FILE"], flush=True)
for step in range(1, 6):
    report(step * 10, 50)
    time.sleep(0.03)
with open(os.environ["GPUOPT_PROGRESS_FILE"], "a") as f:
    f.write("not a report\\n")
report(50, 50)
"""


def test_the_agent_forwards_the_jobs_progress_before_its_exit(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    daemon = ScriptedDaemon(
        {
            "job": {"name": "train", "run": f"{sys.executable} {script}", "probes": "none"},
            "heartbeat_s": 0.05,
        }
    )
    instance = tmp_path / "i-1"
    # A file an earlier job left on this disk is not this job's.
    instance.mkdir()
    (instance / "progress.jsonl").write_text('{"step": 999999}\n')
    config = AgentConfig(
        daemon_url="http://d",
        token="t",
        attempt_key="train-1",
        metadata_kind="aws-imds",
        cloud="local",
        agent_dir=instance / "agent",
        flush_s=10,
        progress_poll_s=0.02,
    )
    agent = Agent(
        config,
        client=daemon,  # type: ignore[arg-type]
        watcher=ScriptedWatcher(),
        register_backoff=Backoff(base=0.01, cap=0.02),
        send_backoff=Backoff(base=0.01, cap=0.05),
        telemetry_source=lambda: None,
    )
    assert agent.run() == 0
    kinds = daemon.kinds()
    reports = [e.data for e in daemon.events if e.kind == "progress"]
    assert reports, kinds
    assert reports[-1] == {"step": 50, "total": 50}
    assert all(r["total"] == 50 and r["step"] in (10, 20, 30, 40, 50) for r in reports)
    assert [r["step"] for r in reports] == sorted({r["step"] for r in reports})
    last = max(i for i, k in enumerate(kinds) if k == "progress")
    assert last < kinds.index("job_exited")
    log = (instance / "agent" / "job.log").read_text()
    assert f"progress file {instance / 'progress.jsonl'}" in log
    assert agent.progress is not None and agent.progress.skipped == 1
