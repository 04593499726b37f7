"""The local cloud's state on disk: one JSON file per instance, injected faults, settings.

Everything lives under one state directory so that every process on the machine (the daemon
that owns the instances, `gpuopt local list|interrupt|fail-next`, tests) sees the same cloud.
Writers take an exclusive `flock` on `<state>/lock` for each read-modify-write and replace
files atomically, so a reader never sees half a file and needs no lock.

Layout::

    cloud.json                  metadata server port, default interruption grace
    faults.json                 pending injected launch failures
    instances/i-local-0001.json one record per instance
    instances/i-local-0001/     the instance's "disk": agent dir, console.log
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from optimizer.common.files import private_dir

INSTANCE_PREFIX = "i-local-"
_ID = re.compile(r"^i-local-(\d{4,})$")


@dataclass
class Interruption:
    """A pending or done spot interruption, as the metadata endpoint shows it."""

    notice_at: float  # epoch seconds: when the notice appeared
    kill_at: float  # epoch seconds: when the instance is powered off
    action: str = "terminate"  # AWS instance-action: terminate | stop | hibernate


@dataclass
class InstanceRecord:
    """One local instance. Times are epoch seconds; `launched_at` is the launch call's (the
    instance's process starts then)."""

    id: str
    key: str  # the launch idempotency key
    region: str
    zone: str
    instance_type: str
    market: str
    usd_per_hour: float
    launched_at: float
    job: str = ""
    attempt: int = 0
    state: str = "pending"  # providers.base.InstanceState values
    end_reason: str | None = None  # providers.base.EndReason values
    detail: str = ""
    pid: int | None = None
    start_ticks: int | None = None  # /proc/<pid>/stat starttime: guards against pid reuse
    mark: str = ""  # GPUOPT_LOCAL_INSTANCE of its processes (procs.instance_mark)
    exit_code: int | None = None
    interruption: Interruption | None = None
    stop_requested_at: float | None = None  # when terminate() was called
    stop_at: float | None = None  # terminate(): SIGKILL deadline after the SIGTERM
    ended_at: float | None = None  # when this cloud recorded the end
    # The termination as the cloud reports it for billing, as AWS does: the terminate call's
    # time (shutting-down is not billed), an interruption's power-off time, or when the
    # instance's process ended by itself.
    terminated_at: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def pool(self) -> tuple[str, str, str, str, str]:
        return ("local", self.region, self.zone, self.instance_type, self.market)

    @property
    def ended(self) -> bool:
        return self.state == "terminated"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> InstanceRecord:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        raw = values.get("interruption")
        values["interruption"] = Interruption(**raw) if isinstance(raw, dict) else None
        return cls(**values)


def write_json(path: Path, value: Any) -> None:
    """Write atomically: a temporary file in the same folder, then rename over the target."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(value, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def read_json(path: Path) -> Any | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None


class StateDir:
    """Typed access to a local cloud's state directory."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.instances_dir = self.root / "instances"

    def ensure(self) -> None:
        private_dir(self.instances_dir)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Exclusive across processes (flock) for one read-modify-write."""
        self.ensure()
        with (self.root / "lock").open("a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    # --- instances -------------------------------------------------------------------

    def record_path(self, instance_id: str) -> Path:
        if not _ID.match(instance_id):
            raise KeyError(f"not a local instance id: {instance_id!r}")
        return self.instances_dir / f"{instance_id}.json"

    def disk(self, instance_id: str) -> Path:
        """The instance's own folder (its agent dir and console log)."""
        return self.instances_dir / instance_id

    def load(self, instance_id: str) -> InstanceRecord | None:
        try:
            data = read_json(self.record_path(instance_id))
        except KeyError:
            return None
        return InstanceRecord.from_json(data) if isinstance(data, dict) else None

    def save(self, record: InstanceRecord) -> None:
        self.ensure()
        write_json(self.record_path(record.id), record.to_json())

    def all(self) -> list[InstanceRecord]:
        if not self.instances_dir.is_dir():
            return []
        out = []
        for path in sorted(self.instances_dir.glob(f"{INSTANCE_PREFIX}*.json")):
            data = read_json(path)
            if isinstance(data, dict):
                out.append(InstanceRecord.from_json(data))
        return out

    def by_key(self, key: str) -> InstanceRecord | None:
        return next((r for r in self.all() if r.key == key), None)

    def next_id(self) -> str:
        """One above the highest id ever used here (call under the lock)."""
        numbers = [0]
        if self.instances_dir.is_dir():
            for path in self.instances_dir.glob(f"{INSTANCE_PREFIX}*.json"):
                found = _ID.match(path.stem)
                if found:
                    numbers.append(int(found.group(1)))
        return f"{INSTANCE_PREFIX}{max(numbers) + 1:04d}"

    # --- settings and faults ---------------------------------------------------------

    def settings(self) -> dict[str, Any]:
        data = read_json(self.root / "cloud.json")
        return data if isinstance(data, dict) else {}

    def save_settings(self, values: dict[str, Any]) -> None:
        self.ensure()
        write_json(self.root / "cloud.json", values)

    def faults(self) -> list[dict[str, Any]]:
        data = read_json(self.root / "faults.json")
        return data if isinstance(data, list) else []

    def save_faults(self, faults: list[dict[str, Any]]) -> None:
        self.ensure()
        write_json(self.root / "faults.json", faults)
