"""The agent's settings (from the environment the bootstrap script sets) and the
registration answer (what to run), both checked where they enter."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from optimizer.agent.imds import (
    AWS_POLL_S,
    DEFAULT_METADATA_URL,
    OwnedFileError,
    UnknownWatcherKind,
    check_watcher_kind,
    owned_file_path,
)
from optimizer.protocol import (
    DEFAULT_HEARTBEAT_S,
    ENV_AGENT_TOKEN,
    ENV_ATTEMPT_KEY,
    ENV_CHECKPOINT_URI,
    ENV_CLOUD,
    ENV_DAEMON_URL,
    ENV_EXPECTED_GPUS,
    ENV_METADATA_KIND,
    ENV_PROGRESS_FILE,
    PROBE_KINDS,
    REQUIRED_ENV,
    RUN_PROBE_KINDS,
    STOP_GRACE_S,
    Gang,
    Internode,
    Job,
    RegisterAnswer,
    Wait,
)

# A provider's name as the daemon's registry spells it (the agent knows no provider list).
CLOUD_NAME = re.compile(r"^[a-z][a-z0-9-]{0,31}$")


class AgentConfigError(ValueError):
    """The environment lacks a setting or holds one the agent cannot use."""


def default_agent_dir() -> Path:
    return Path.home() / ".local" / "state" / "gpuopt-agent"


@dataclass(frozen=True)
class AgentConfig:
    """What `gpuopt agent run` reads from its environment (see `from_env`)."""

    daemon_url: str
    token: str = field(repr=False)
    attempt_key: str
    metadata_kind: str  # which metadata watcher runs (optimizer/agent/imds.py WATCHERS)
    cloud: str = "aws"
    metadata_url: str = DEFAULT_METADATA_URL
    agent_dir: Path = field(default_factory=default_agent_dir)
    instance_id: str | None = None
    poll_s: float = AWS_POLL_S
    stop_grace_s: float = STOP_GRACE_S  # a stop command without grace_s gets this long
    flush_s: float = 120.0  # how long the final events are retried before giving up
    self_stop_s: float = 10.0  # after an ending notice the daemon did not take
    fence_poll_s: float = 0.25  # how often a fenced agent asks whether it may start the job
    log_poll_s: float = 0.5  # how often the job's output files are looked at for new output
    telemetry_s: float = 10.0  # how often NVML is read (GPU telemetry)
    probe_cpu_n: int | None = None
    probe_timeout_s: float | None = None
    expected_gpus: int | None = None  # the offer's GPU count: the probe's default
    # Checkpoints that follow the job (docs/checkpoints.md): how often the local folder is
    # looked at for new commits, the least time the final upload gets after a stop, how often
    # a fenced agent looks for a newer checkpoint to prefetch, and how many times a restore
    # that fails on the store's errors is tried before the job starts without it.
    checkpoint_scan_s: float = 2.0
    checkpoint_min_flush_s: float = 5.0
    checkpoint_prefetch_s: float = 30.0
    checkpoint_restore_tries: int = 3
    progress_poll_s: float = 2.0  # how often the job's progress file is read (docs/progress.md)

    @property
    def checkpoints_dir(self) -> Path:
        """The job's local checkpoint folder: beside the agent's, private to the instance."""
        return self.agent_dir.parent / "checkpoints"

    @property
    def progress_file(self) -> Path:
        """The file the job appends its progress reports to (GPUOPT_PROGRESS_FILE)."""
        return self.agent_dir.parent / "progress.jsonl"

    @property
    def go_file(self) -> Path:
        """The go file of a job started in standby (GPUOPT_GO_FILE, docs/standby.md)."""
        return self.agent_dir.parent / "standby-go"

    @property
    def staging_dir(self) -> Path:
        """Where a fenced agent prefetches the newest checkpoint."""
        return self.agent_dir.parent / "checkpoint-staging"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> AgentConfig:
        env = os.environ if env is None else env

        def get(name: str) -> str | None:
            value = env.get(name, "").strip()
            return value or None

        missing = [n for n in REQUIRED_ENV if get(n) is None]
        if missing:
            raise AgentConfigError(f"missing environment variable(s): {', '.join(missing)}")
        cloud = (get(ENV_CLOUD) or "aws").lower()
        if not CLOUD_NAME.match(cloud):
            raise AgentConfigError(
                f"{ENV_CLOUD}={cloud!r}: expected a provider name (lowercase letters, digits, -)"
            )
        try:
            kind = check_watcher_kind((get(ENV_METADATA_KIND) or "").lower())
        except UnknownWatcherKind as exc:
            raise AgentConfigError(f"{ENV_METADATA_KIND}: {exc}") from None
        metadata_url = get("GPUOPT_METADATA_URL") or DEFAULT_METADATA_URL
        if kind == "owned-file":  # a notice file on the machine, not an HTTP endpoint
            try:
                owned_file_path(metadata_url)
            except OwnedFileError as exc:
                raise AgentConfigError(f"GPUOPT_METADATA_URL: {exc}") from None

        def number(name: str, default: float | None) -> float | None:
            raw = get(name)
            if raw is None:
                return default
            try:
                value = float(raw)
            except ValueError:
                raise AgentConfigError(f"{name}={raw!r} is not a number") from None
            if value <= 0:
                raise AgentConfigError(f"{name} must be > 0")
            return value

        agent_dir = get("GPUOPT_AGENT_DIR")
        cpu_n = number("GPUOPT_PROBE_CPU_N", None)
        gpus = number(ENV_EXPECTED_GPUS, None)
        return cls(
            daemon_url=get(ENV_DAEMON_URL) or "",
            token=get(ENV_AGENT_TOKEN) or "",
            attempt_key=get(ENV_ATTEMPT_KEY) or "",
            metadata_kind=kind,
            cloud=cloud,
            metadata_url=metadata_url,
            agent_dir=Path(agent_dir) if agent_dir else default_agent_dir(),
            instance_id=get("GPUOPT_INSTANCE_ID"),
            poll_s=number("GPUOPT_AGENT_POLL_S", AWS_POLL_S) or AWS_POLL_S,
            stop_grace_s=number("GPUOPT_AGENT_STOP_GRACE_S", STOP_GRACE_S) or STOP_GRACE_S,
            flush_s=number("GPUOPT_AGENT_FLUSH_S", 120.0) or 120.0,
            self_stop_s=number("GPUOPT_AGENT_SELF_STOP_S", 10.0) or 10.0,
            fence_poll_s=number("GPUOPT_AGENT_FENCE_POLL_S", 0.25) or 0.25,
            log_poll_s=number("GPUOPT_AGENT_LOG_POLL_S", 0.5) or 0.5,
            telemetry_s=number("GPUOPT_AGENT_TELEMETRY_S", 10.0) or 10.0,
            progress_poll_s=number("GPUOPT_AGENT_PROGRESS_POLL_S", 2.0) or 2.0,
            probe_cpu_n=int(cpu_n) if cpu_n else None,
            probe_timeout_s=number("GPUOPT_PROBE_TIMEOUT_S", None),
            expected_gpus=int(gpus) if gpus else None,
        )


@dataclass(frozen=True)
class Assignment:
    """The registration answer (`protocol.RegisterAnswer`): what to run and how often to
    check in."""

    job: Job
    attempt: int
    restarts: int
    heartbeat_s: float
    fence: Wait | None = None  # why the job must not start yet (None: it may)
    gang: Gang | None = None  # a multi-node attempt: rank, nodes, rank 0's address
    internode: Internode | None = None  # run the inter-node probe now, with these
    probe: str = "none"  # the probe to run: the daemon's choice, else the spec's `probes`

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> Assignment:
        """The answer, checked; ValueError (a pydantic ValidationError) naming what is wrong."""
        answer = RegisterAnswer.model_validate(raw)
        if answer.job.probes not in PROBE_KINDS:
            raise ValueError(f"unknown probes value {answer.job.probes!r}")
        probe = answer.probe or answer.job.probes
        if probe not in RUN_PROBE_KINDS:
            raise ValueError(f"unknown probe value {probe!r}")
        return cls(
            job=answer.job,
            attempt=answer.attempt or 1,
            restarts=answer.restarts,
            heartbeat_s=max(float(answer.heartbeat_s or DEFAULT_HEARTBEAT_S), 0.05),
            fence=answer.fence,
            gang=answer.gang,
            internode=answer.internode,
            probe=probe,
        )

    def protocol_env(
        self, checkpoints: Path | None = None, progress: Path | None = None
    ) -> dict[str, str]:
        """The job's environment; `checkpoints` is the local folder the agent syncs (a job
        with a `checkpoint` location), else the job's own `checkpoint_dir` is handed on;
        `progress` the file the agent reads the job's progress from."""
        env = {str(k): str(v) for k, v in self.job.env.items()}
        if progress is not None:
            env[ENV_PROGRESS_FILE] = str(progress)
        if checkpoints is not None and self.job.checkpoint is not None:
            # The job's checkpoints are shipped (and pruned) by the agent: it only commits them.
            env[ENV_CHECKPOINT_URI] = self.job.checkpoint.uri
        env.update(
            GPUOPT_CHECKPOINT_DIR=str(checkpoints or self.job.checkpoint_dir or ""),
            GPUOPT_ATTEMPT=str(self.attempt),
            GPUOPT_RESTARTS=str(self.restarts),
            GPUOPT_JOB=str(self.job.name or ""),
        )
        gang = self.gang
        if gang is not None and gang.master_addr and gang.master_port:
            env.update(rendezvous_env(gang.rank, gang.nodes, gang.master_addr, gang.master_port))
        return env


def rendezvous_env(rank: int, nodes: int, host: str, port: int) -> dict[str, str]:
    """What a node's job gets: gpuopt's names, torch.distributed's env:// names for one process
    per node, and torchrun's (`PET_*`, which its options read) for a torchrun per node."""
    return {
        "GPUOPT_NODE_RANK": str(rank),
        "GPUOPT_NUM_NODES": str(nodes),
        "GPUOPT_MASTER_ADDR": host,
        "GPUOPT_MASTER_PORT": str(port),
        "MASTER_ADDR": host,
        "MASTER_PORT": str(port),
        "NODE_RANK": str(rank),
        "RANK": str(rank),
        "WORLD_SIZE": str(nodes),
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "PET_NNODES": str(nodes),
        "PET_NODE_RANK": str(rank),
        "PET_MASTER_ADDR": host,
        "PET_MASTER_PORT": str(port),
    }
