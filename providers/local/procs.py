"""Local instances as processes: which are alive, and powering one off.

Every process of an instance carries `GPUOPT_LOCAL_INSTANCE=<id>` in its environment (set at
launch and inherited by the agent and the job, which runs in a session of its own). Powering
an instance off kills every process that carries its mark, the way a VM's power-off takes
every process with it, however they were started or re-parented. Linux only (`/proc`).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from optimizer.common.procs import proc_start_ticks, same_process, signal_group
from providers.local.state import InstanceRecord

MARK_ENV = "GPUOPT_LOCAL_INSTANCE"


def alive(record: InstanceRecord) -> bool:
    """Whether the instance's process (the very one launched, not a reused pid) still runs."""
    return same_process(record.pid, record.start_ticks)


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
