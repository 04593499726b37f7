"""A job's name as stored and as shown: a removed job's row is renamed, and people see its name.

Light on purpose (no store machinery): the CLI's cost tables and the console read it.
"""

from __future__ import annotations

# A removed job's row is renamed `<name>~removed~<id>`: no job name has a `~` (the pattern in
# policies/schema.py), so its name is free for a new job and no new job can take this one.
REMOVED_MARK = "~removed~"


def given_name(stored: str) -> str:
    """The name a job was submitted under, from its row's name (renamed once removed)."""
    return stored.split(REMOVED_MARK, 1)[0]


def job_label(stored: str) -> str:
    """How a job's row name is shown to people: its name, and a removed job's as
    `train (removed job 3)` (its id tells it from another removed `train`), never the row's
    `train~removed~3`."""
    name, mark, job_id = stored.partition(REMOVED_MARK)
    return f"{name} (removed job {job_id})" if mark else stored


__all__ = ["REMOVED_MARK", "given_name", "job_label"]
