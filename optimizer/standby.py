"""Standby start (docs/standby.md): a replacement's job starts before the old one has ended,
does its slow start-up (imports, CUDA, the model, the data loaders), and waits for the go.

A job spec with `standby: true` asks for it. While the replacement's agent waits at the
fence (the old attempt's job still runs), it starts the job with `GPUOPT_STANDBY=1` and
`GPUOPT_GO_FILE` naming the go file; the job builds what does not depend on the checkpoint,
then calls `wait_for_go()`, which says it is ready (`<go file>.ready`: the daemon waits for
that before it stops the old job, so the old job trains on while the new one starts up).
When the fence lifts the agent restores the newest checkpoint
into `GPUOPT_CHECKPOINT_DIR` and only then gives the go: `wait_for_go()` returns and the job
loads the checkpoint and trains. A stop that comes first is given instead: `wait_for_go()`
raises `Stopped` (a SystemExit with status 143, what a SIGTERM'd job reports), so the job
ends without a traceback. Outside standby (the variable unset, gpuopt not used, or a job spec
without `standby`) `wait_for_go()` returns at once, so the same script runs either way:

    from optimizer.standby import wait_for_go; wait_for_go()

The go file, and why it is a FIFO first: while the job waits, the path is a named pipe the
agent made, and the job sleeps in the kernel (`poll`) on it, so it wakes within
microseconds of the go and spends no CPU meanwhile, where polling a plain file would trade
latency for wake-ups. The go itself is the path becoming a regular file holding `go` (or
`stop`), put in place atomically (`os.replace`), and the agent writes the same word into the
pipe for whoever waits on it. So a process that looks only after the go (a late rank of a
torchrun job), or many processes at once (a pipe's bytes go to one reader, a regular file is
there for all), or a shell loop on `[ -f "$GPUOPT_GO_FILE" ]`, all see it. The one race a
pipe leaves (a waiter that opened the pipe just after the agent had looked for waiters) is
closed by looking at the path again every `RECHECK_S`.

This module is for jobs as much as for gpuopt: it imports nothing beyond the standard
library (as optimizer/progress.py), so a job pays nothing for it. `python -m
optimizer.standby` (and `gpuopt standby wait`) waits from a shell: exit 0 on the go, 143 on
a stop.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import stat
import sys
import time
from pathlib import Path

ENV_STANDBY = "GPUOPT_STANDBY"  # "1" while the job was started in standby
ENV_GO_FILE = "GPUOPT_GO_FILE"  # the go file's path
GO = "go"
STOP = "stop"
STOPPED_EXIT = 143  # 128 + SIGTERM: a standby job stopped before its go ends as a stopped job
TIMEOUT_EXIT = 124  # the CLI's status when its --timeout ran out (as timeout(1))
RECHECK_S = 0.25  # a waiter looks at the path again this often, whatever the pipe says
_MISSING_S = 0.05  # no go file at all yet: looked for this often
_SPURIOUS_S = 0.01  # the pipe woke the waiter without a go (not our agent's doing)


class Stopped(SystemExit):
    """The attempt was stopped before the go: the job must end (status 143) without loading
    anything. A SystemExit, so a job that does not catch it exits quietly."""

    def __init__(self) -> None:
        super().__init__(STOPPED_EXIT)


def in_standby(environ: dict[str, str] | None = None) -> bool:
    """Whether this process was started in standby (and so must wait for the go)."""
    env = os.environ if environ is None else environ
    return env.get(ENV_STANDBY) == "1" and bool(env.get(ENV_GO_FILE))


def given(path: str | Path) -> str | None:
    """The word given (`go` or `stop`) once the path is a regular file; None while the go
    has not been given (the path is still the pipe, or not there)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None
        with open(path, encoding="utf-8") as f:
            word = f.read(16).strip()
    except FileNotFoundError:
        return None
    return STOP if word == STOP else GO


def wait_for_go(timeout: float | None = None, *, path: str | Path | None = None) -> bool:
    """Wait for the agent's go; True once given, False at once when not in standby (nothing
    to wait for: the checkpoint is already in place). `Stopped` when the attempt was stopped
    instead; TimeoutError after `timeout` seconds without either. `path` names the go file
    where the environment does not (tests, a wrapper)."""
    if path is None:
        if not in_standby():
            return False
        path = os.environ[ENV_GO_FILE]
    deadline = None if timeout is None else time.monotonic() + timeout
    mark_ready(path)
    word = _wait(Path(path), deadline)
    if word == STOP:
        raise Stopped()
    return True


def ready_file(go_file: str | Path) -> Path:
    """The file a job in standby creates once it waits (`<go file>.ready`): the agent then
    reports it ready, and the daemon stops the old job (docs/standby.md)."""
    return Path(f"{go_file}.ready")


def mark_ready(go_file: str | Path) -> None:
    """Say that this job has started up and waits for the go (`wait_for_go` does it)."""
    with contextlib.suppress(OSError):  # never fatal: the daemon's wait for it is bounded
        ready_file(go_file).touch(mode=0o600)


def _left(deadline: float | None) -> float:
    """Seconds until `deadline`, at most RECHECK_S; TimeoutError once it has passed."""
    if deadline is None:
        return RECHECK_S
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("no go from the gpuopt agent in time")
    return min(left, RECHECK_S)


def _wait(path: Path, deadline: float | None) -> str:
    while True:
        word = given(path)
        if word is not None:
            return word
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        except FileNotFoundError:
            time.sleep(min(_left(deadline), _MISSING_S))
            continue
        try:
            if stat.S_ISFIFO(os.fstat(fd).st_mode):
                _sleep_on_pipe(path, fd, deadline)
        finally:
            os.close(fd)


def _sleep_on_pipe(path: Path, fd: int, deadline: float | None) -> None:
    """Sleep on the pipe until the agent writes to it (or closes it), the path has become
    the go file, or RECHECK_S has passed; returns for the caller to look at the path."""
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP)
    while given(path) is None:
        events = poller.poll(_left(deadline) * 1000)
        if not events:
            return  # RECHECK_S passed: look at the path again (the race in the docstring)
        try:
            data = os.read(fd, 64)
        except BlockingIOError:
            data = b""
        if not data and given(path) is None:
            # A writer came and went without the go (no agent of ours does that), or a
            # system that reports a pipe without writers as hung up: do not spin on it.
            time.sleep(_SPURIOUS_S)
            return


# --- the agent's side ---------------------------------------------------------------------


def prepare(path: str | Path) -> None:
    """Make the go file a fresh pipe (what a job in standby waits on), owner-only."""
    path = Path(path)
    for old in (path, ready_file(path)):
        with contextlib.suppress(FileNotFoundError):
            old.unlink()
    os.mkfifo(path, 0o600)


def give(path: str | Path, word: str = GO) -> None:
    """Give the go (or `stop`): wake whoever sleeps on the pipe and leave the word in a
    regular file at the path for whoever looks later. Returns at once, waiter or none."""
    path = Path(path)
    # A writer end, held until the word is in place: a reader that opens the pipe meanwhile
    # (a shell's `cat`, which blocks in open() until a pipe has a writer) is let through
    # and gets the word or an end of file, never a wait with no writer to come. Read-write,
    # as Linux opens a FIFO so without blocking, waiter or none.
    try:
        writer: int | None = os.open(path, os.O_RDWR | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno not in (errno.ENXIO, errno.ENOENT):
            raise
        writer = None
    try:
        tmp = path.with_name(f".{path.name}.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(word + "\n")
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)  # the go, for every reader from now on
        if writer is not None:
            with contextlib.suppress(OSError):  # every waiter may have gone meanwhile
                os.write(writer, (word + "\n").encode())
    finally:
        if writer is not None:
            os.close(writer)


def main(argv: list[str] | None = None) -> int:
    """`python -m optimizer.standby [--timeout S]`: wait for the go from a shell; exit 0 on
    the go (or outside standby), 143 on a stop, 124 when the timeout ran out."""
    args = list(sys.argv[1:] if argv is None else argv)
    timeout: float | None = None
    if args[:1] == ["--timeout"] and len(args) == 2:
        try:
            timeout = float(args[1])
        except ValueError:
            args = ["bad"]
        else:
            args = []
    if args:
        print("usage: python -m optimizer.standby [--timeout SECONDS]", file=sys.stderr)
        return 2
    return wait_exit(timeout)


def wait_exit(timeout: float | None) -> int:
    """`wait_for_go` as an exit status: 0 on the go (or outside standby), 143 on a stop, 124
    when the timeout ran out; one line on stderr for the two last."""
    try:
        wait_for_go(timeout)
    except Stopped:
        print("gpuopt standby: stopped before the go", file=sys.stderr)
        return STOPPED_EXIT
    except TimeoutError:
        print(f"gpuopt standby: no go within {timeout:g} s", file=sys.stderr)
        return TIMEOUT_EXIT
    return 0


__all__ = [
    "ENV_GO_FILE",
    "ENV_STANDBY",
    "GO",
    "STOP",
    "Stopped",
    "give",
    "given",
    "in_standby",
    "mark_ready",
    "prepare",
    "ready_file",
    "wait_for_go",
]


if __name__ == "__main__":
    sys.exit(main())
