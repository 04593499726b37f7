"""The progress convention (docs/progress.md): how a job says how far it has got.

The job appends one JSON line per report to the file named by `$GPUOPT_PROGRESS_FILE`:
`{"step": 1200, "total": 10000}` (`total` optional, the steps of the whole run). The agent
reads the file's new lines and forwards the newest report to the daemon, which works out the
job's speed per attempt and instance type and its ETA. A line that is not such an object is
skipped with a warning; it never stops the job or the agent.

This module is for jobs as much as for gpuopt: it imports nothing beyond the standard
library, so `from optimizer.progress import report` costs a job nothing (no pydantic, no
torch). Any language can follow the convention by appending the line itself.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

ENV = "GPUOPT_PROGRESS_FILE"  # optimizer.protocol.ENV_PROGRESS_FILE (the same name)
MAX_STEP = 2**62  # a step past this is a broken job's (the store keeps 64-bit integers)
MAX_LINE_BYTES = 4096  # a report is a few dozen bytes; a longer line is skipped


class ProgressLineError(ValueError):
    """A line that is not a progress report; the message says what is wrong with it."""


@dataclass(frozen=True, slots=True)
class Report:
    """One progress report: the steps done, and the steps of the whole run where known."""

    step: int
    total: int | None = None

    def to_data(self) -> dict[str, int]:
        """The report as the line's (and the agent event's) JSON object."""
        if self.total is None:
            return {"step": self.step}
        return {"step": self.step, "total": self.total}


def _count(value: object, name: str, *, least: int) -> int:
    # bool is an int to Python, never a step count.
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProgressLineError(f"{name} must be a whole number, not {value!r}")
    if not least <= value <= MAX_STEP:
        raise ProgressLineError(f"{name} must be between {least} and 2**62, not {value}")
    return value


def check(step: object, total: object = None) -> Report:
    """A report from its two numbers; ProgressLineError naming the bad one."""
    done = _count(step, "step", least=0)
    whole = None if total is None else _count(total, "total", least=1)
    return Report(done, whole)


def parse_line(text: str) -> Report:
    """One line of the progress file as a report; ProgressLineError saying what is wrong (not
    JSON, not an object, a missing or bad `step` or `total`). Other keys are ignored."""
    if len(text.encode("utf-8", "replace")) > MAX_LINE_BYTES:
        raise ProgressLineError(f"longer than {MAX_LINE_BYTES} bytes")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProgressLineError(f"not JSON ({exc.msg})") from None
    except ValueError:  # a number too long to read
        raise ProgressLineError("not JSON") from None
    if not isinstance(value, dict):
        raise ProgressLineError('not a JSON object like {"step": 10, "total": 100}')
    if "step" not in value:
        raise ProgressLineError("no step")
    return check(value["step"], value.get("total"))


def line(step: int, total: int | None = None) -> str:
    """The line a report is written as, newline included."""
    return json.dumps(check(step, total).to_data(), separators=(", ", ": ")) + "\n"


def report(step: int, total: int | None = None, *, path: str | Path | None = None) -> bool:
    """Append a progress report to `path`, else to `$GPUOPT_PROGRESS_FILE`; False (nothing
    written) where neither names a file (the job runs outside gpuopt) or the file cannot be
    written (reporting never stops the job). A bad `step` or `total` is a ValueError."""
    text = line(step, total)
    target = path if path is not None else os.environ.get(ENV)
    if not target:
        return False
    try:
        # One write of one short line to a file opened for appending: a reader never sees
        # half of it next to another writer's (POSIX O_APPEND).
        with open(target, "a", encoding="utf-8") as out:
            out.write(text)
    except OSError:
        return False
    return True


__all__ = ["ENV", "ProgressLineError", "Report", "check", "line", "parse_line", "report"]
