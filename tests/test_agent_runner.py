"""The job as a child process: its group, its environment, its log, signals and stop."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from optimizer.agent.runner import JobRunner, job_env
from tests.helpers import wait_until

# Saves nothing, but exits 143 by itself on SIGTERM after a short cleanup, like a real job.
GRACEFUL = (
    "import signal, sys, time\n"
    "def bye(s, f):\n"
    "    print('cleaning up', flush=True); time.sleep(0.1); sys.exit(143)\n"
    "signal.signal(signal.SIGTERM, bye)\n"
    "print('ready', flush=True)\n"
    "time.sleep(60)\n"
)
STUBBORN = (
    "import signal, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print('ready', flush=True)\n"
    "time.sleep(60)\n"
)


def script(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return f"{sys.executable} {path}"


def group_runs(pgid: int, program: bytes) -> bool:
    """Whether a process of the group `pgid` has exec'd `program`."""
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.getpgid(int(name)) != pgid:
                    continue
                argv0 = Path(f"/proc/{name}/cmdline").read_bytes().split(b"\0")[0]
            except (ProcessLookupError, OSError):
                continue
            if Path(argv0.decode(errors="replace")).name.encode() == program:
                return True
    return False


def log_has(log: Path, text: str) -> bool:
    return log.exists() and text in log.read_text()


def test_the_job_gets_the_protocol_env_but_never_the_agent_token(tmp_path: Path) -> None:
    base = {"PATH": os.environ["PATH"], "GPUOPT_AGENT_TOKEN": "s3cret", "KEEP": "1"}
    env = job_env(base, {"GPUOPT_ATTEMPT": "2", "KEEP": "2"})
    assert "GPUOPT_AGENT_TOKEN" not in env
    assert env["GPUOPT_ATTEMPT"] == "2" and env["KEEP"] == "2"
    log = tmp_path / "job.log"
    runner = JobRunner(run="env | sort", env=env, log_path=log, cwd=tmp_path).start()
    end = runner.wait(10)
    assert end is not None and end.exit_code == 0 and end.succeeded
    text = log.read_text()
    assert "GPUOPT_ATTEMPT=2" in text and "s3cret" not in text and "run: starting" in text


def test_the_job_runs_in_its_own_process_group(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    started: list[int] = []
    runner = JobRunner(
        run="echo trapped; sleep 30",
        env=dict(os.environ),
        log_path=log,
        on_started=lambda pid, phase: started.append(pid),
    ).start()
    wait_until(lambda: started, what="job start")
    # A SIGTERM that lands before the shell has set its traps ends it by the signal, not 143;
    # one that lands before `sleep` has been exec'd (not yet forked, or forked but still the
    # shell's copy) never reaches sleep, and the shell (as POSIX shells do) runs its trap only
    # once `sleep 30` has finished: so wait until sleep itself runs in the job's group.
    wait_until(lambda: log_has(log, "trapped"), what="the traps to be set")
    wait_until(lambda: group_runs(started[0], b"sleep"), what="sleep in the job's group")
    assert os.getpgid(started[0]) == started[0] != os.getpgid(0)
    runner.stop(5)
    end = runner.wait(10)
    assert end is not None and end.stopped and end.exit_code == 143


def test_a_forwarded_sigterm_reaches_the_command_and_its_own_status_is_kept(
    tmp_path: Path,
) -> None:
    log = tmp_path / "job.log"
    runner = JobRunner(
        run=f"cd {tmp_path} && {script(tmp_path, 'g.py', GRACEFUL)}",
        env=dict(os.environ),
        log_path=log,
    ).start()
    wait_until(lambda: log_has(log, "ready"), what="the job to be ready")
    assert runner.signal(signal.SIGTERM)
    end = runner.wait(10)
    assert end is not None
    # The shell waited for python's cleanup and passed its status on.
    assert (end.exit_code, end.signal, end.stopped) == (143, None, False)
    assert log_has(log, "cleaning up")


def test_stop_kills_a_job_that_ignores_sigterm_after_the_grace(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    runner = JobRunner(
        run=script(tmp_path, "s.py", STUBBORN), env=dict(os.environ), log_path=log
    ).start()
    wait_until(lambda: log_has(log, "ready"), what="the job to be ready")
    runner.stop(0.3)
    end = runner.wait(10)
    assert end is not None and end.stopped
    assert end.signal == signal.SIGKILL and end.exit_code is None


def test_a_failing_setup_stops_before_run(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    runner = JobRunner(
        setup="echo installing; exit 3",
        run="echo should-not-run",
        env=dict(os.environ),
        log_path=log,
    ).start()
    end = runner.wait(10)
    assert end is not None and (end.phase, end.exit_code) == ("setup", 3)
    assert "installing" in log.read_text() and "should-not-run" not in log.read_text()


def test_stop_during_setup_means_run_never_starts(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    runner = JobRunner(
        setup="echo installing; sleep 30",
        run="echo should-not-run",
        env=dict(os.environ),
        log_path=log,
    ).start()
    wait_until(lambda: log_has(log, "installing"), what="setup")
    runner.stop(5)
    end = runner.wait(10)
    assert end is not None and end.phase == "setup" and end.stopped
    assert "should-not-run" not in log.read_text()


def test_what_the_job_leaves_behind_in_its_group_is_cleaned_up(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    pidfile = tmp_path / "bg.pid"
    runner = JobRunner(
        run=f"sleep 60 & echo $! > {pidfile}; echo main-done",
        env=dict(os.environ),
        log_path=log,
        linger_s=2,
    ).start()
    end = runner.wait(10)
    assert end is not None and end.exit_code == 0
    leftover = int(pidfile.read_text())
    wait_until(lambda: not Path(f"/proc/{leftover}").exists() or _zombie(leftover), what="sweep")


def _zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rfind(")") + 2] == "Z"


def test_the_job_inherits_only_allow_listed_variables_from_the_agent() -> None:
    base = {
        "PATH": "/usr/bin",
        "HOME": "/root",
        "LANG": "C.UTF-8",
        "LC_ALL": "C",
        "SLACK_WEBHOOK_URL": "https://hooks.example/x",
        "DATABASE_URL": "postgresql://u:p@db/x",
        "GPUOPT_DAEMON_URL": "http://daemon",
        "GPUOPT_AGENT_TOKEN": "s3cret",
    }
    env = job_env(base, {"GPUOPT_ATTEMPT": "1", "MINE": "spec"})
    assert env == {
        "PATH": "/usr/bin",
        "HOME": "/root",
        "LANG": "C.UTF-8",
        "LC_ALL": "C",
        "PYTHONUNBUFFERED": "1",
        "GPUOPT_ATTEMPT": "1",
        "MINE": "spec",
    }


def test_a_failure_reports_the_last_line_of_its_stderr(tmp_path: Path) -> None:
    runner = JobRunner(
        setup="echo installing; echo 'ERROR: No matching distribution for torch==9' >&2; "
        "echo '' >&2; exit 1",
        run="echo should-not-run",
        env=dict(os.environ),
        log_path=tmp_path / "job.log",
        err_path=tmp_path / "job.err",
    ).start()
    end = runner.wait(10)
    assert end is not None and (end.phase, end.exit_code) == ("setup", 1)
    assert end.error == "ERROR: No matching distribution for torch==9"
    assert end.to_data()["error"] == end.error


def test_a_long_or_binary_last_line_is_cut_and_made_printable(tmp_path: Path) -> None:
    runner = JobRunner(
        setup="true",
        run="printf 'x\\001y%.0s' $(seq 1 200) >&2; exit 2",
        env=dict(os.environ),
        log_path=tmp_path / "job.log",
        err_path=tmp_path / "job.err",
    ).start()
    end = runner.wait(10)
    assert end is not None and (end.phase, end.exit_code) == ("run", 2)
    assert end.error is not None and len(end.error) == 300 and end.error.endswith("…")
    assert "\x01" not in end.error and end.error.startswith("x y")


def test_a_success_or_a_stop_reports_no_error(tmp_path: Path) -> None:
    runner = JobRunner(
        setup="echo warn >&2",
        run="echo done",
        env=dict(os.environ),
        log_path=tmp_path / "job.log",
        err_path=tmp_path / "job.err",
    ).start()
    end = runner.wait(10)
    assert end is not None and end.succeeded and end.error is None
    assert "error" not in end.to_data()


def test_on_exit_is_called_once_the_exit_is_known(tmp_path: Path) -> None:
    seen: list[object] = []
    runner = JobRunner(
        run="exit 3",
        env={},
        log_path=tmp_path / "job.log",
        on_exit=lambda: seen.append(runner.exit),
    )
    runner.start()
    wait_until(lambda: seen, what="on_exit")
    end = runner.wait(0)
    assert end is not None and end.exit_code == 3
    assert seen == [end]  # called once, with the exit already set
