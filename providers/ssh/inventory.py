"""The owned machines: their inventory (the daemon config's `providers.ssh.machines`, and
those `gpuopt machines add` registered), and the state the provider keeps of them.

A machine is written once, where people edit it, and checked before it is used: its name is
unique, its region is a cloud region name (the one nearest the machine: a server in a
Frankfurt rack says `eu-central-1`), so compliance presets and egress rates place it as they
place a cloud region, and its GPUs are what the machine itself reports over SSH
(`python -m optimizer.agent.inventory`). `site` names the building or rack (the offers'
zone); it defaults to the region.

What the provider keeps (`<data dir>/ssh/state.json`, written whole and atomically under a
lock): the machines added at run time, each machine's last check, its drain, and every
instance it started (machine, GPU indices, process id, when it started and ended). GPUs are
given to instances from this record, so two jobs never share one.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from policies import regions
from providers.config import ProviderConfig

NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
GPU_MODEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,31}$")
TCO_KEYS = (
    "capex_usd",
    "life_years",
    "power_kw",
    "pue",
    "usd_per_kwh",
    "ops_fraction_per_year",
    "utilization",
)


class MachineSpec(BaseModel):
    """One owned machine, as the inventory writes it."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: str = Field(description="Unique name: lowercase letters, digits and dashes.")
    host: str = Field(min_length=1, description="Host name or address SSH reaches.")
    user: str = Field(min_length=1, description="The SSH user.")
    port: int = Field(22, ge=1, le=65535)
    key_file: str | None = Field(None, description="Private key (None: the SSH defaults).")
    region: str = Field(description="The cloud region name nearest the machine (eu-central-1).")
    site: str | None = Field(None, description="Building or rack; the offers' zone.")
    gpus: int = Field(ge=1, le=64, description="GPUs the machine has.")
    gpu_model: str = Field(description="The GPU model as the catalog names it (T4, H100-80GB).")
    gpu_memory_gib: float = Field(16.0, gt=0)
    vcpus: int = Field(8, ge=1)
    ram_gib: float = Field(32.0, gt=0)
    python: str = Field(
        "python3",
        min_length=1,
        description="The command that runs the Python on the machine that has gpuopt (a "
        "path, or a prefix such as `env VAR=... /opt/gpuopt/bin/python`); used to read the "
        "machine's inventory. Jobs get the agent through the daemon's `agent.install`.",
    )
    work_dir: str = Field(".gpuopt", min_length=1, description="Where instances live there.")
    tco: dict[str, float] = Field(
        default_factory=dict, description=f"TCO overrides: {', '.join(TCO_KEYS)}."
    )
    simulate_gpus: bool = Field(
        False,
        description="Development and tests: a machine with no GPU reports `gpus` simulated "
        "ones (as the local cloud does) instead of being refused.",
    )

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not NAME.match(value):
            raise ValueError("a machine name is lowercase letters, digits and dashes")
        return value

    @field_validator("gpu_model")
    @classmethod
    def _model(cls, value: str) -> str:
        if not GPU_MODEL.match(value):
            raise ValueError(f"{value!r} is not a GPU model name")
        return value

    @field_validator("region")
    @classmethod
    def _region(cls, value: str) -> str:
        if regions.lookup("aws", value) is None and regions.lookup("gcp", value) is None:
            raise ValueError(
                f"unknown region {value!r}: give the AWS or GCP region nearest the machine "
                "(eu-central-1 for Frankfurt), so compliance and egress place it"
            )
        return value

    @field_validator("tco")
    @classmethod
    def _tco(cls, value: dict[str, float]) -> dict[str, float]:
        for key, number in value.items():
            if key not in TCO_KEYS:
                raise ValueError(f"unknown TCO key {key!r}; expected one of {', '.join(TCO_KEYS)}")
            if number <= 0:
                raise ValueError(f"tco.{key} must be above 0")
        if value.get("utilization", 0.5) > 1:
            raise ValueError("tco.utilization is a share of hours, at most 1")
        return value

    @model_validator(mode="after")
    def _site(self) -> MachineSpec:
        if self.site is not None and not NAME.match(self.site):
            raise ValueError("a site name is lowercase letters, digits and dashes")
        return self

    @property
    def zone(self) -> str:
        return self.site or self.region

    @property
    def label(self) -> str:
        return f"{self.user}@{self.host}:{self.port}"


class SshConfig(ProviderConfig):
    """The `providers.ssh` section: the machines and how SSH checks them."""

    machines: list[MachineSpec] = Field(default_factory=list)
    known_hosts: str | None = Field(
        None,
        description="The OpenSSH known_hosts file host keys are checked against "
        "(default: <data dir>/ssh/known_hosts).",
    )
    trust_new_hosts: bool = Field(
        False,
        description="Pin a host key seen for the first time (trust on first use). Off: an "
        "unknown host is refused until its key is in known_hosts. A changed key is always "
        "refused.",
    )
    connect_timeout_s: float = Field(10.0, gt=0, le=120)
    lost_after_s: float = Field(
        300.0,
        gt=0,
        description="A machine that cannot be reached this long has gone away: its instances "
        "end (their jobs restart elsewhere from their checkpoints) and its GPUs are freed.",
    )
    spot_interval_s: int = Field(
        30, ge=1, description="How often the owned offers are read again (free GPUs change)."
    )

    @field_validator("machines")
    @classmethod
    def _unique(cls, value: list[MachineSpec]) -> list[MachineSpec]:
        seen: set[str] = set()
        for machine in value:
            if machine.name in seen:
                raise ValueError(f"machine {machine.name!r} is listed twice")
            seen.add(machine.name)
        return value


@dataclass
class Instance:
    """One instance the provider started on a machine (its agent and job)."""

    id: str
    key: str
    machine: str
    gpus: list[int]
    job: str
    attempt: int
    instance_type: str
    usd_per_hour: float
    started_at: float
    pid: int | None = None
    dir: str = ""
    ended_at: float | None = None
    end_reason: str | None = None  # preempted | user | failed
    detail: str = ""

    @property
    def ended(self) -> bool:
        return self.ended_at is not None


@dataclass
class Drain:
    """A machine being taken back: no new work from `since`, gone at `power_off_at`."""

    since: float
    power_off_at: float
    reason: str = "drain"


@dataclass
class Check:
    """A machine's last check over SSH."""

    at: float
    ok: bool
    detail: str = ""
    gpus: list[dict[str, Any]] = field(default_factory=list)
    simulated: bool = False
    disk_free_gib: float | None = None


@dataclass
class State:
    added: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> MachineSpec dump
    checks: dict[str, Check] = field(default_factory=dict)
    drains: dict[str, Drain] = field(default_factory=dict)
    instances: dict[str, Instance] = field(default_factory=dict)
    first_seen: dict[str, float] = field(default_factory=dict)  # name -> its first check
    # name -> when describe first failed to reach it, in the current run of failures
    unreachable: dict[str, float] = field(default_factory=dict)
    next_id: int = 1

    def live(self, machine: str | None = None) -> list[Instance]:
        return [
            i
            for i in self.instances.values()
            if not i.ended and (machine is None or i.machine == machine)
        ]

    def used_gpus(self, machine: str) -> set[int]:
        return {g for i in self.live(machine) for g in i.gpus}

    def busy_gpu_seconds(self, machine: str, since: float, until: float) -> float:
        """GPU-seconds the machine's instances held between `since` and `until`."""
        total = 0.0
        for i in self.instances.values():
            if i.machine != machine:
                continue
            start, end = max(i.started_at, since), min(i.ended_at or until, until)
            if end > start:
                total += len(i.gpus) * (end - start)
        return total

    def by_key(self, key: str) -> Instance | None:
        return next((i for i in self.instances.values() if i.key == key), None)


def _load(path: Path) -> State:
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return State()
    return State(
        added=dict(raw.get("added", {})),
        checks={k: Check(**v) for k, v in raw.get("checks", {}).items()},
        drains={k: Drain(**v) for k, v in raw.get("drains", {}).items()},
        instances={k: Instance(**v) for k, v in raw.get("instances", {}).items()},
        first_seen={k: float(v) for k, v in raw.get("first_seen", {}).items()},
        unreachable={k: float(v) for k, v in raw.get("unreachable", {}).items()},
        next_id=int(raw.get("next_id", 1)),
    )


class StateFile:
    """The provider's state in one JSON file, read and written whole under a lock."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.RLock()

    def read(self) -> State:
        with self._lock:
            return _load(self.path)

    @contextmanager
    def edit(self) -> Iterator[State]:
        """The state to change; written back atomically when the block ends without error."""
        with self._lock:
            state = _load(self.path)
            yield state
            self._write(state)

    def _write(self, state: State) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        data = {
            "added": state.added,
            "checks": {k: asdict(v) for k, v in state.checks.items()},
            "drains": {k: asdict(v) for k, v in state.drains.items()},
            "instances": {k: asdict(v) for k, v in state.instances.items()},
            "first_seen": state.first_seen,
            "unreachable": state.unreachable,
            "next_id": state.next_id,
        }
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".state.")
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(tmp, self.path)


__all__ = [
    "TCO_KEYS",
    "Check",
    "Drain",
    "Instance",
    "MachineSpec",
    "SshConfig",
    "State",
    "StateFile",
]
