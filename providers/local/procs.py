"""Local instances as processes: which are alive, and powering one off.

Every process of an instance carries `GPUOPT_LOCAL_INSTANCE=<id>` in its environment (set at
launch and inherited by the agent and the job, which runs in a session of its own). Powering
an instance off kills every process that carries its mark, the way a VM's power-off takes
every process with it, however they were started or re-parented. Linux only (`/proc`).
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

from providers.local.state import InstanceRecord

MARK_ENV = "GPUOPT_LOCAL_INSTANCE"


def proc_start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot, or None when it is gone.

    A zombie counts as gone: it has exited and only waits to be reaped.
    """
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    rest = raw[raw.rfind(")") + 2 :].split()
    if not rest or rest[0] in ("Z", "X"):
        return None
    return int(rest[19])  # field 22 overall


def alive(record: InstanceRecord) -> bool:
    """Whether the instance's process (the very one launched, not a reused pid) still runs."""
    if record.pid is None:
        return False
    ticks = proc_start_ticks(record.pid)
    return ticks is not None and (record.start_ticks is None or ticks == record.start_ticks)


def marked_pids(instance_id: str) -> list[int]:
    """Live processes that carry the instance's mark (this user's processes only)."""
    needle = f"{MARK_ENV}={instance_id}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            environ = Path(f"/proc/{name}/environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0") and proc_start_ticks(int(name)) is not None:
            found.append(int(name))
    return found


def signal_group(pid: int | None, signum: int) -> None:
    """Signal the process group led by `pid`, if any is left."""
    if pid is None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signum)


def power_off(record: InstanceRecord) -> int:
    """SIGKILL the instance's process group and every process carrying its mark; how many."""
    if alive(record):
        signal_group(record.pid, signal.SIGKILL)
    killed = 0
    for pid in marked_pids(record.id):
        try:
            os.kill(pid, signal.SIGKILL)
            killed += 1
        except (ProcessLookupError, PermissionError):
            pass
    return killed
