"""The checkpoint window end to end on the local cloud: a real daemon, real agent processes, a
job that records when its SIGTERM came. The replacement cannot launch (no capacity), so the
old job's stop is the window's: at the notice's power-off less the job's allowance."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from optimizer.clock import Clock
from optimizer.daemon.service import Daemon
from providers.local import LocalCloud
from tests.helpers import api, wait_until
from tests.helpers.code import ship_files
from tests.helpers.jobs import E2E_FIXTURES, job_body, running_instance

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("daemon_env")]

clock, cloud, daemon = E2E_FIXTURES

# Times on the host's monotonic clock (one for every process here, as the test's).
TERM_JOB = """\
import os, signal, sys, time
log = os.path.join(os.environ["GPUOPT_CHECKPOINT_DIR"], "window.log")
def line(what):
    with open(log, "a") as f:
        f.write(f"{what} {time.monotonic()}\\n")
def term(*_):
    line("term")
    sys.exit(143)
signal.signal(signal.SIGTERM, term)
line("start")
while True:
    time.sleep(0.01)
"""
# Generous: a loaded host delays the agent's loop and the job's handler; the bench
# (bench/checkpoint_window.py) gives the figures.
TOLERANCE_S = 1.5


def test_the_old_job_gets_its_sigterm_at_the_power_off_less_its_allowance(
    tmp_path: Path, daemon: Daemon, cloud: LocalCloud, clock: Clock
) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    code = ship_files(daemon, tmp_path / "job-code", {"term_job.py": TERM_JOB})
    allowance = 6.0
    body = job_body(
        "window", ckpt, steps=1, code=code, checkpoint_dir=str(ckpt), checkpoint_allowance_s=6
    )
    body["run"] = "python term_job.py"
    with api(daemon) as client:
        assert client.post("/jobs", json=body).status_code == 201
    instance = wait_until(lambda: running_instance(cloud, "window", 1), 30, "attempt 1 running")
    log = ckpt / "window.log"
    wait_until(lambda: log.exists() or None, 30, "the job to start")
    cloud.fail_next("*", "capacity", times=1000)  # no replacement: the window stops the job
    # The power-off 14 s away: the stop is due 8 s after the notice, time for the agent (it
    # polls the metadata every 0.5 s) and the daemon to have heard of it.
    record = cloud.interrupt(instance, grace_s=14)
    mono, now = time.monotonic(), clock().timestamp()
    assert record.interruption is not None
    due = mono + (record.interruption.kill_at - allowance - now)
    term = wait_until(
        lambda: next((ln for ln in log.read_text().splitlines() if ln.startswith("term")), None),
        30,
        "the job's SIGTERM",
    )
    error = float(term.split()[1]) - due
    assert -0.05 <= error <= TOLERANCE_S, f"SIGTERM {error:+.3f} s from the window's instant"
