"""The job as a child process: `setup`, then `run`, each through `/bin/sh -c`.

Each command runs in a session (and process group) of its own, with stdout appended to the
job's log file and stderr to its error file (or to the log file too when none is given), so
a signal meant for the agent's terminal never reaches it by accident and the agent dying
leaves it running. Signals go to the whole process group, because a shell does not pass
them on to the command it waits for. The shell itself gets a trap, so it waits for that
command and exits with its status (143 after a SIGTERM) instead of dying first; a SIGTERM
that lands between two commands exits 143 rather than 0, so a
stopped job is never mistaken for a finished one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from optimizer.clock import machine_now, utc_text
from optimizer.common.environ import basic_env
from optimizer.common.files import append_private, private_dir
from optimizer.common.procs import proc_stat, same_process, signal_group

log = logging.getLogger(__name__)

# Shell traps: on TERM/INT/HUP wait for the foreground command, then exit with its status;
# a status of 0 (the signal arrived between commands) becomes 128 + the signal.
_TRAPS = "".join(
    f'trap \'st=$?; [ "$st" -eq 0 ] && st={code}; exit "$st"\' {name}\n'
    for name, code in (("TERM", 143), ("INT", 130), ("HUP", 129))
)
LINGER_S = 5.0  # after the command ends, what it left in its group gets this long after SIGTERM


@dataclass(frozen=True, slots=True)
class JobExit:
    """How the job ended. `exit_code` None: the shell died of `signal`."""

    phase: str  # setup | run
    exit_code: int | None
    signal: int | None
    stopped: bool  # ended after stop() was called
    error: str | None = None  # a failure's last line of stderr (ERROR_LINE_CHARS at most)

    @property
    def succeeded(self) -> bool:
        return self.exit_code == 0 and not self.stopped

    def to_data(self) -> dict[str, object]:
        return {
            "exit_code": self.exit_code,
            "signal": self.signal,
            "phase": self.phase,
            "stopped": self.stopped,
            **({"error": self.error} if self.error else {}),
        }


ERROR_LINE_CHARS = 300  # of the last stderr line a failure reports
_TAIL_BYTES = 8192


def last_line(path: Path | None) -> str | None:
    """The last non-blank line of a job's output file, printable and cut to ERROR_LINE_CHARS
    (what a failure's reason quotes); None when there is none or it cannot be read."""
    if path is None:
        return None
    try:
        with path.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - _TAIL_BYTES))
            tail = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    for line in reversed(tail.splitlines()):
        text = "".join(c if c.isprintable() else " " for c in line).strip()
        if text and not text.startswith("[gpuopt agent "):
            return text if len(text) <= ERROR_LINE_CHARS else text[: ERROR_LINE_CHARS - 1] + "…"
    return None


def job_env(base: Mapping[str, str], extra: Mapping[str, str]) -> dict[str, str]:
    """The allow-listed part of the agent's environment (`basic_env`: no credentials, no
    GPUOPT_* setting, not the agent's token), plus `extra` (the job's own env and the protocol
    variables, which win)."""
    env = basic_env(base)
    env.setdefault("PYTHONUNBUFFERED", "1")  # so the log shows progress as it happens
    env.update(extra)
    return env


def _group_alive(pgid: int) -> bool:
    """Whether any process of the group still runs. Zombies do not count: an orphan that has
    exited waits for init to reap it, which some container inits do only now and then."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        fields = proc_stat(int(name))  # state, ppid, pgrp, ...
        if fields and len(fields) > 2 and fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
            return True
    return False


class JobRunner:
    """Runs setup then run on a thread; `wait()` gives the JobExit, and `on_exit` is called
    (on that thread) the moment it is known."""

    def __init__(
        self,
        *,
        run: str,
        setup: str | None = None,
        env: Mapping[str, str],
        log_path: Path,
        err_path: Path | None = None,
        cwd: Path | None = None,
        on_started: Callable[[int, str], object] = lambda pid, phase: None,
        on_exit: Callable[[], object] = lambda: None,
        linger_s: float = LINGER_S,
    ) -> None:
        self.commands = [(p, c) for p, c in (("setup", setup), ("run", run)) if c and c.strip()]
        self.env = dict(env)
        self.log_path = log_path
        self.err_path = err_path
        self.cwd = cwd
        self.on_started = on_started
        self.on_exit = on_exit
        self.linger_s = linger_s
        self.proc: subprocess.Popen[bytes] | None = None
        self.phase = "setup"
        self.exit: JobExit | None = None
        self._stopping = False
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._main, name="job-runner", daemon=True)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def start(self) -> JobRunner:
        self._thread.start()
        return self

    def wait(self, timeout: float | None = None) -> JobExit | None:
        self._done.wait(timeout)
        return self.exit

    def done(self) -> bool:
        return self._done.is_set()

    def signal(self, signum: int) -> bool:
        """Send `signum` to the running command's process group; False if none runs."""
        with self._lock:
            proc = self.proc
            if proc is None or proc.poll() is not None:
                return False
            return signal_group(proc.pid, signum)

    def stop(self, grace_s: float) -> None:
        """SIGTERM now, SIGKILL after `grace_s` if still running; no further phase starts."""
        with self._lock:
            first = not self._stopping
            self._stopping = True
        if not first:
            return
        self.signal(signal.SIGTERM)
        threading.Thread(target=self._kill_after, args=(grace_s,), daemon=True).start()

    def _kill_after(self, grace_s: float) -> None:
        if self._done.wait(grace_s):
            return
        with self._lock:
            proc = self.proc
        if proc is not None:
            log.warning("job still running %.0f s after SIGTERM: SIGKILL", grace_s)
            signal_group(proc.pid, signal.SIGKILL)

    # --- the thread ------------------------------------------------------------------

    def _note(self, log_file: IO[bytes], text: str) -> None:
        stamp = utc_text(machine_now(), timespec="seconds")
        with contextlib.suppress(OSError):
            log_file.write(f"[gpuopt agent {stamp}] {text}\n".encode())
            log_file.flush()

    def _main(self) -> None:
        result = JobExit(phase="setup", exit_code=None, signal=None, stopped=False)
        try:
            private_dir(self.log_path.parent)
            with contextlib.ExitStack() as files:  # the job's output: its owner's alone
                log_file = files.enter_context(append_private(self.log_path))
                err_file = (
                    files.enter_context(append_private(self.err_path)) if self.err_path else None
                )
                for phase, command in self.commands:
                    result = self._run_one(phase, command, log_file, err_file)
                    if result.exit_code != 0 or result.stopped:
                        break
        except OSError as exc:
            log.error("could not start the job: %s", exc)
            result = JobExit(self.phase, 127, None, self._stopping)
        finally:
            self.exit = result
            self._done.set()
            self.on_exit()

    def _run_one(
        self, phase: str, command: str, log_file: IO[bytes], err_file: IO[bytes] | None
    ) -> JobExit:
        with self._lock:
            if self._stopping:
                return JobExit(phase, None, None, True)
            self.phase = phase
            self._note(log_file, f"{phase}: starting")
            self.proc = subprocess.Popen(
                ["/bin/sh", "-c", _TRAPS + command],
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=err_file if err_file is not None else subprocess.STDOUT,
                env=self.env,
                cwd=self.cwd,
                start_new_session=True,
            )
            proc = self.proc
        if phase == "run":
            self.on_started(proc.pid, phase)
        code = proc.wait()
        self._sweep(proc.pid)
        exit_code, signum = (code, None) if code >= 0 else (None, -code)
        error = None
        if code != 0 and not self._stopping:
            with contextlib.suppress(OSError):
                (err_file or log_file).flush()
            error = last_line(self.err_path or self.log_path)
        self._note(log_file, f"{phase}: exited with {exit_code if signum is None else -signum}")
        return JobExit(phase, exit_code, signum, self._stopping, error)

    def _sweep(self, pgid: int) -> None:
        """What the command left running in its group gets SIGTERM, then SIGKILL."""
        if not _group_alive(pgid):
            return
        signal_group(pgid, signal.SIGTERM)
        deadline = time.monotonic() + self.linger_s
        while _group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.05)
        signal_group(pgid, signal.SIGKILL)


class AdoptedJob:
    """A job an earlier agent started and left running: watched by pid, exit status unknown.

    Only its own process group is signalled, and only while its leader is the process that
    was recorded (same start time), so a reused pid is never hit.
    """

    def __init__(self, pid: int, start_ticks: int | None, *, poll_s: float = 0.5) -> None:
        self.pid = pid
        self.start_ticks = start_ticks
        self.poll_s = poll_s
        self.exit: JobExit | None = None
        self._stopping = False
        self._done = threading.Event()
        threading.Thread(target=self._watch, name="adopted-job", daemon=True).start()

    def alive(self) -> bool:
        return same_process(self.pid, self.start_ticks)

    def _watch(self) -> None:
        while self.alive():
            time.sleep(self.poll_s)
        self.exit = JobExit("run", None, None, self._stopping)
        self._done.set()

    def wait(self, timeout: float | None = None) -> JobExit | None:
        self._done.wait(timeout)
        return self.exit

    def done(self) -> bool:
        return self._done.is_set()

    def signal(self, signum: int) -> bool:
        return self.alive() and signal_group(self.pid, signum)

    def stop(self, grace_s: float) -> None:
        if self._stopping:
            return
        self._stopping = True
        self.signal(signal.SIGTERM)

        def kill_later() -> None:
            if not self._done.wait(grace_s):
                self.signal(signal.SIGKILL)

        threading.Thread(target=kill_later, daemon=True).start()
