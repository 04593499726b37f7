"""Process identity on Linux (`/proc`): is a pid still the very process we started, and
signalling its process group. Shared by the agent (adopting a job after a restart) and the
local cloud (its instances are processes). And a call run in a forked child (`call_forked`)."""

from __future__ import annotations

import os
import pickle
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def proc_stat(pid: int) -> list[str] | None:
    """The fields of `/proc/<pid>/stat` after the command name (state, ppid, pgrp, ...), or
    None when the process is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    return raw[raw.rfind(")") + 2 :].split()


def proc_start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot, or None when it is gone.

    A zombie counts as gone: it has exited and only waits to be reaped.
    """
    fields = proc_stat(pid)
    if not fields or fields[0] in ("Z", "X"):
        return None
    return int(fields[19])  # field 22 overall


def same_process(pid: int | None, start_ticks: int | None) -> bool:
    """Whether `pid` still runs and is the process that started at `start_ticks` (not a
    later one that reuses the pid); a None `start_ticks` accepts any live process."""
    if pid is None:
        return False
    ticks = proc_start_ticks(pid)
    return ticks is not None and (start_ticks is None or ticks == start_ticks)


def pids_with_env(name: str, accept: Callable[[str], bool]) -> list[int]:
    """Live processes (zombies left out) whose environment sets `name` to a value `accept`
    takes; only the processes this user may read."""
    prefix = f"{name}=".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        value = next((v[len(prefix) :] for v in environ.split(b"\0") if v.startswith(prefix)), None)
        taken = value is not None and accept(value.decode(errors="replace"))
        if taken and proc_start_ticks(int(entry)) is not None:
            found.append(int(entry))
    return found


def signal_group(pgid: int | None, signum: int) -> bool:
    """Signal the process group led by `pgid`; False when none is left (or it is not ours)."""
    if pgid is None:
        return False
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def call_forked(fn: Callable[[], T]) -> T:
    """`fn()` in a forked child, its result (or exception) brought back pickled: for work
    whose imports the caller should not keep for good (the daemon's first start creates its
    schema through Alembic, about 10 MB it would then hold while idle). Where the platform
    cannot fork, `fn()` here."""
    if not hasattr(os, "fork"):
        return fn()
    for stream in (sys.stdout, sys.stderr):  # else the child could write them out again
        stream.flush()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: answers on the pipe and exits, never returns
        code = 0
        try:
            os.close(read)
            try:
                payload = pickle.dumps((True, fn()))
            except BaseException as exc:
                try:
                    payload = pickle.dumps((False, exc))
                except Exception:
                    payload = pickle.dumps((False, RuntimeError(f"{type(exc).__name__}: {exc}")))
            with os.fdopen(write, "wb") as out:
                out.write(payload)
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as answer:
        data = answer.read()
    _, status = os.waitpid(pid, 0)
    if not data:
        raise ChildProcessError(f"the child process ended without an answer (status {status})")
    ok, value = pickle.loads(data)
    if ok:
        return value  # type: ignore[no-any-return]
    raise value
