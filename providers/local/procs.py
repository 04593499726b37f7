"""Local instances as processes: which are alive, and powering one off.

Every process of an instance carries `GPUOPT_LOCAL_INSTANCE=<mark>` in its environment (set
at launch and inherited by the agent and the job, which runs in a session of its own).
Powering an instance off kills every process that carries its mark, the way a VM's power-off
takes every process with it, however they were started or re-parented. The mark names the
instance and the state directory of the cloud that launched it (`instance_mark`): every
local cloud numbers its instances from i-local-0001, and one must never kill another's.
The launched process itself is known by its pid and start time (`alive`), never by its pid
alone. Linux only (`/proc`).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from optimizer.common.environ import MACHINE_MARK_ENV
from optimizer.common.procs import pids_with_env, same_process, signal_group
from providers.local.state import InstanceRecord

MARK_ENV = MACHINE_MARK_ENV


def instance_mark(state_root: Path, instance_id: str) -> str:
    """The MARK_ENV value of one instance: its id and its cloud's state directory (resolved,
    so every process that opens the cloud by another path agrees)."""
    return f"{instance_id}@{Path(state_root).resolve()}"


def alive(record: InstanceRecord) -> bool:
    """Whether the instance's process (the very one launched, not a reused pid) still runs."""
    return same_process(record.pid, record.start_ticks)


def marked_pids(mark: str) -> list[int]:
    """Live processes that carry `mark` (an instance_mark) exactly (this user's processes
    only)."""
    return pids_with_env(MARK_ENV, lambda value: value == mark)


def power_off(record: InstanceRecord) -> int:
    """SIGKILL the instance's process group and every process carrying its mark; returns how
    many marked processes were killed. A record without a mark (launched by an older gpuopt,
    whose marks were bare ids that other clouds' instances share) loses its group only."""
    if alive(record):
        signal_group(record.pid, signal.SIGKILL)
    if not record.mark:
        return 0
    killed = 0
    for pid in marked_pids(record.mark):
        try:
            os.kill(pid, signal.SIGKILL)
            killed += 1
        except (ProcessLookupError, PermissionError):
            pass
    return killed
