"""The agent protocol, v1 (docs/agent-protocol.md): the one definition both sides use.

The daemon's routes (`optimizer/api/agent.py`) parse the requests and build the answers with
these models, and the agent (`optimizer/agent/`) builds the requests and parses the answers
with the same ones, so the wire has one description. The JSON is the protocol's: a model
dumped with `wire()` gives exactly the bytes an agent of any earlier version sends or reads
(tests/test_protocol.py holds the documented examples to that).

Also here: the environment the bootstrap script sets for the agent (the names it reads), and
the protocol's limits (how much one call may carry, how often to check in).

Every model ignores the fields it does not know, so an older agent and a newer daemon (or the
other way round) still understand each other; the answers' defaults are what an agent assumes
when a field is missing.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    RootModel,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    StrictBool,
    StrictInt,
    field_validator,
    model_serializer,
)

from optimizer.clock import parse_utc
from optimizer.standby import ENV_GO_FILE as ENV_GO_FILE
from optimizer.standby import ENV_STANDBY as ENV_STANDBY

PREFIX = "/agent/v1"

# -- the limits -------------------------------------------------------------------------------

HEARTBEAT_S = 2  # the heartbeat the daemon asks for: commands (stop) ride on answers
DEFAULT_HEARTBEAT_S = 10.0  # what an agent uses when an answer names none
STOP_GRACE_S = 30  # a stop's SIGTERM-to-SIGKILL time, when the command names none
MAX_EVENTS_PER_CALL = 500  # events in one /events call (the daemon refuses more with 422)
EVENTS_BATCH = 100  # the agent sends at most this many a call
MAX_CHUNKS_PER_CALL = 64  # chunks of output in one /logs call
MAX_CHUNK_CHARS = 64 * 1024  # characters in one chunk's text
CHUNK_BYTES = 64 * 1024  # the agent cuts chunks of at most this many bytes (so fewer chars)
LOG_BATCH_CHUNKS = 16  # the agent sends at most this many chunks a call...
LOG_BATCH_BYTES = 256 * 1024  # ...and this many bytes of output
# The inter-node probe: a link below this fraction of the fabric's line rate fails the attempt
# (a gpuopt choice, not a published figure: NCCL over a healthy fabric reaches well above it),
# and the probe's own time limit, rendezvous included.
INTERNODE_MIN_FRACTION = 0.25
INTERNODE_TIMEOUT_S = 120

# -- the bootstrap's environment --------------------------------------------------------------

ENV_DAEMON_URL = "GPUOPT_DAEMON_URL"
ENV_ATTEMPT_KEY = "GPUOPT_ATTEMPT_KEY"
ENV_CLOUD = "GPUOPT_CLOUD"
ENV_METADATA_KIND = "GPUOPT_METADATA_KIND"
ENV_AGENT_TOKEN = "GPUOPT_AGENT_TOKEN"
ENV_EXPECTED_GPUS = "GPUOPT_EXPECTED_GPUS"
# Set by the bootstrap itself; the agent settings' `env` may not name them.
BOOTSTRAP_ENV = (
    ENV_DAEMON_URL,
    ENV_ATTEMPT_KEY,
    ENV_CLOUD,
    ENV_METADATA_KIND,
    ENV_AGENT_TOKEN,
    ENV_EXPECTED_GPUS,
)
# The job's environment: where the agent ships the job's checkpoints (set only then; the
# job then leaves pruning its checkpoint folders to the agent, docs/checkpoints.md).
ENV_CHECKPOINT_URI = "GPUOPT_CHECKPOINT_URI"
# The file the job appends its progress reports to (docs/progress.md, optimizer/progress.py);
# set by the agent to a file on the instance, so a job spec may not set it.
ENV_PROGRESS_FILE = "GPUOPT_PROGRESS_FILE"
# Standby start (docs/standby.md): ENV_STANDBY and ENV_GO_FILE (imported above from the job's
# helper, optimizer/standby.py) are set by the agent on a job it starts before the fence
# lifts, the second naming the go file the job then waits on. The agent reports
# STANDBY_READY_EVENT once the job waits for its go (or ended before it).
STANDBY_READY_EVENT = "standby_ready"
# What the agent cannot run without.
REQUIRED_ENV = (ENV_DAEMON_URL, ENV_AGENT_TOKEN, ENV_ATTEMPT_KEY, ENV_METADATA_KIND)

PROBE_KINDS = ("quick", "deep", "none")  # a job spec's `probes`
# What the daemon may tell an agent to run (`RegisterAnswer.probe`): the spec's kind, or the
# handover probe where the instance type already has a full result (docs/probes.md).
QUICK_PROBE, HANDOVER_PROBE = "quick", "handover"
RUN_PROBE_KINDS = (HANDOVER_PROBE, *PROBE_KINDS)


def probe_to_run(spec_probes: str, type_probed: bool) -> str:
    """The probe an attempt runs: the spec's `probes`, but `handover` instead of `quick` once
    the attempt's instance type has a usable full (quick or deep) result, so the sustained
    stage runs at a type's first boot and in `deep`, and a later boot is judged in seconds."""
    return HANDOVER_PROBE if spec_probes == QUICK_PROBE and type_probed else spec_probes


class _Message(BaseModel):
    """A protocol message: unknown fields are ignored (either side may be newer)."""

    model_config = ConfigDict(extra="ignore")

    def wire(self) -> dict[str, Any]:
        """The JSON object sent on the wire."""
        return self.model_dump(mode="json")


# -- requests (agent -> daemon) ---------------------------------------------------------------


class Register(_Message):
    attempt_key: str = Field(min_length=1, max_length=200)
    instance_id: str | None = None
    provider: str | None = None
    hostname: str | None = None
    agent_version: str | None = None
    # host:port where the other nodes of a multi-node attempt reach this one (its rendezvous
    # port, free when the agent registered).
    address: str | None = Field(None, max_length=300)


class AgentEvent(_Message):
    id: str = Field(min_length=1, max_length=100)
    kind: str = Field(min_length=1, max_length=50)
    at: str | None = None
    data: dict[str, Any] = Field(default_factory=dict)


class JobExitedData(BaseModel):
    """A `job_exited` event's `data`: the exit status is folded into the attempt row, so it
    must be a number the store holds; other keys pass as they are."""

    model_config = ConfigDict(extra="allow")

    # The attempt row's exit_code is a 32-bit integer; the daemon stores 128 + signal.
    exit_code: StrictInt | None = Field(None, ge=-(2**31), le=2**31 - 1)
    signal: StrictInt | None = Field(None, ge=1, le=127)
    phase: str | None = Field(None, max_length=20)
    error: str | None = Field(None, max_length=2000)  # why it failed: stderr's last line
    stopped: StrictBool | None = None
    adopted: StrictBool | None = None
    log_chunks: StrictInt | None = Field(None, ge=0, le=2**31 - 1)


# Checkpoint reports (docs/checkpoints.md): bounds a real checkpoint stays far inside (a
# petabyte, a million files, a week's upload), so a report past them is a broken agent's.
_NAME = r"^[A-Za-z0-9._-]{1,200}$"
_MAX_BYTES = 2**50
_MAX_FILES = 1_000_000
_MAX_SECONDS = 7 * 24 * 3600.0
_MAX_MIB_S = 1_000_000.0
MAX_ERROR_CHARS = 2000  # of a `checkpoint_failed` error, kept in its event


class _CheckpointData(BaseModel):
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    name: str = Field(pattern=_NAME)
    step: StrictInt | None = Field(None, ge=0, le=2**62)
    size_bytes: StrictInt = Field(ge=0, le=_MAX_BYTES)
    seconds: float = Field(ge=0, le=_MAX_SECONDS)
    mib_s: float = Field(ge=0, le=_MAX_MIB_S)

    @field_validator("name")
    @classmethod
    def _not_dots(cls, value: str) -> str:
        if value in (".", ".."):
            raise ValueError("must not be '.' or '..'")
        return value


class CheckpointCommittedData(_CheckpointData):
    """A `checkpoint_committed` event's `data`: a checkpoint uploaded, manifest last."""

    files: StrictInt = Field(ge=0, le=_MAX_FILES)
    final: StrictBool = False


class CheckpointRestoredData(_CheckpointData):
    """A `checkpoint_restored` event's `data`: the newest checkpoint fetched before the job."""

    fetched_bytes: StrictInt = Field(ge=0, le=_MAX_BYTES)
    reused_bytes: StrictInt = Field(ge=0, le=_MAX_BYTES)


class CheckpointPrunedData(BaseModel):
    """A `checkpoint_pruned` event's `data`: the checkpoints deleted from the bucket."""

    model_config = ConfigDict(extra="allow")

    names: list[Annotated[str, Field(pattern=_NAME, max_length=200)]] = Field(max_length=1000)


class CheckpointFailedData(BaseModel):
    """A `checkpoint_failed` event's `data`: an upload that failed (it is tried again)."""

    model_config = ConfigDict(extra="allow")

    name: str = Field(max_length=200)
    error: str  # the daemon keeps its first MAX_ERROR_CHARS


PROGRESS_EVENT = "progress"  # the job's newest progress report, as the agent read it


class ProgressData(BaseModel):
    """A `progress` event's `data`: the newest report the job wrote (docs/progress.md)."""

    model_config = ConfigDict(extra="allow")

    step: StrictInt = Field(ge=0, le=2**62)
    total: StrictInt | None = Field(None, ge=1, le=2**62)


# The data of the events whose fields the daemon folds into numbers or rows, checked at the
# edge: a bad one is refused (422) with the whole call.
EVENT_DATA: dict[str, type[BaseModel]] = {
    "job_exited": JobExitedData,
    "checkpoint_committed": CheckpointCommittedData,
    "checkpoint_restored": CheckpointRestoredData,
    "checkpoint_pruned": CheckpointPrunedData,
    "checkpoint_failed": CheckpointFailedData,
    PROGRESS_EVENT: ProgressData,
}


class Events(_Message):
    attempt_key: str = Field(min_length=1, max_length=200)
    events: list[AgentEvent] = Field(default_factory=list, max_length=MAX_EVENTS_PER_CALL)


class LogChunk(_Message):
    seq: int = Field(ge=0, le=2**31 - 1)
    stream: Literal["stdout", "stderr"]
    at: str | None = Field(None, max_length=64)
    text: str = Field(max_length=MAX_CHUNK_CHARS)


class Logs(_Message):
    attempt_key: str = Field(min_length=1, max_length=200)
    chunks: list[LogChunk] = Field(default_factory=list, max_length=MAX_CHUNKS_PER_CALL)


# -- answers (daemon -> agent) ----------------------------------------------------------------


class Wait(RootModel[str]):
    """The fence: why the agent must not start the job yet. On the wire a string; an answer's
    `fence` is null (or missing, or empty) once the job may start."""

    @property
    def reason(self) -> str:
        return self.root

    def __str__(self) -> str:
        return self.root

    @classmethod
    def of(cls, reason: str | None) -> Wait | None:
        """The fence for a reason to wait (None: none, the job may start)."""
        return cls(reason) if reason else None


class Command(_Message):
    """What the daemon asks of the agent: `stop` (SIGTERM the job, SIGKILL after `grace_s`)."""

    kind: str
    reason: str | None = None
    grace_s: int | float | None = None


def stop(reason: str, grace_s: int | float = STOP_GRACE_S) -> Command:
    return Command(kind="stop", reason=reason, grace_s=grace_s)


class _Optional(_Message):
    """A message whose `OMITTED` fields are left out of the JSON while None or false (the
    answers have always had them only when they say something); its other None fields are
    sent as null."""

    OMITTED: ClassVar[frozenset[str]] = frozenset()

    @model_serializer(mode="wrap")
    def _leave_out(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo):  # type: ignore[no-untyped-def]  # unannotated: the JSON schema stays the model's
        out: dict[str, Any] = handler(self)
        for name in self.OMITTED:
            value = out.get(name, 0)
            if value is None or value is False:
                del out[name]
        return out


class Gang(_Optional):
    """A gang node's place: its rank, the size, and rank 0's address once known."""

    OMITTED = frozenset({"master_addr", "master_port"})

    rank: int = 0
    nodes: int = 1
    master_addr: str | None = None
    master_port: int | None = None


class Internode(_Message):
    """Run the inter-node probe now, with these."""

    rank: int
    nodes: int
    master_addr: str
    master_port: int
    expected_gbps: int | float | None = None
    min_fraction: float = INTERNODE_MIN_FRACTION
    timeout_s: int | float = INTERNODE_TIMEOUT_S


class CheckpointRef(_Message):
    """Where the job's checkpoints go (docs/checkpoints.md): the object store location, and
    how many of the newest to keep there."""

    uri: str = Field(min_length=1, max_length=2000)
    keep: int = Field(3, ge=1, le=100)


class CodeArchive(_Message):
    """The code archive the job runs in: the agent fetches `url` (a path is relative to the
    daemon's address) with its token, checks the SHA-256, unpacks it and runs `setup` and
    `run` there (`workdir` then relative inside it)."""

    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    size: int = Field(ge=0)
    url: str = Field(min_length=1, max_length=2000)


class Job(_Optional):
    """What to run (the job spec's part the agent needs); `checkpoint`, `code` and
    `checkpoint_allowance_s` are absent from the wire when the job has none, `standby` unless
    it is true (docs/standby.md: the agent may start the job while the fence holds, and gives
    it the go when it lifts).

    `checkpoint_allowance_s`: the job's checkpoint allowance (the spec's), so that after an
    interruption notice the agent stops the job itself at the power-off less it should the
    daemon's stop not have come by then; absent (an older daemon): the agent waits for it."""

    OMITTED = frozenset({"checkpoint", "code", "standby", "checkpoint_allowance_s"})

    name: str | None = None
    run: str
    setup: str | None = None
    workdir: str | None = None
    env: dict[str, Any] = Field(default_factory=dict)
    checkpoint_dir: str | None = None
    probes: str = "none"
    expected_gpus: int | None = None
    checkpoint: CheckpointRef | None = None
    code: CodeArchive | None = None
    standby: StrictBool = False
    checkpoint_allowance_s: float | None = Field(None, ge=0)

    @field_validator("env", mode="before")
    @classmethod
    def _env(cls, value: Any) -> Any:
        return {} if value is None else value


class _Answer(_Optional):
    """An answer that carries commands, the fence and, for a gang node, the rendezvous
    (`gang`, `internode`: absent for one node). Each answer lists its fields itself, in the
    order they have always had on the wire."""

    OMITTED = frozenset({"gang", "internode"})

    @field_validator("fence", mode="before", check_fields=False)
    @classmethod
    def _fence(cls, value: Any) -> Any:
        return None if value == "" else value

    @field_validator("commands", mode="before", check_fields=False)
    @classmethod
    def _commands(cls, value: Any) -> Any:
        return [] if value is None else value


class RegisterAnswer(_Answer):
    """`probe`: the probe this attempt runs (the daemon's choice from `job.probes`, which
    keeps the spec's value); absent from an older daemon, then `job.probes` is run."""

    OMITTED = _Answer.OMITTED | {"probe"}

    job: Job
    attempt: int = 1  # a gang's: its rank 0's number
    restarts: int = 0
    heartbeat_s: int | float = DEFAULT_HEARTBEAT_S
    commands: list[Command] = Field(default_factory=list)
    fence: Wait | None = None
    gang: Gang | None = None
    internode: Internode | None = None
    probe: str | None = None


class EventsAnswer(_Answer):
    ack: list[str] = Field(default_factory=list)
    commands: list[Command] = Field(default_factory=list)
    fence: Wait | None = None
    gang: Gang | None = None
    internode: Internode | None = None


class LogsAnswer(_Message):
    ack: list[int] = Field(default_factory=list)


# -- the notice's power-off ----------------------------------------------------------------------

# How long after a notice an instance goes when the notice names no time: GCP gives 30 s
# after preempting; an AWS notice without a readable time is taken at its two minutes.
GCP_PREEMPT_WARNING = timedelta(seconds=30)
DEFAULT_WARNING = timedelta(minutes=2)


def power_off_time(notice: Mapping[str, Any], noticed_at: datetime) -> datetime | None:
    """When the instance a notice announces goes away (None: a rebalance hint, it stays).

    `notice` is the `interruption_notice` event's data: AWS names the action's time; GCP's
    `time` is when the agent saw the preemption, 30 s before the end. `noticed_at`: when the
    notice was seen, for a notice whose time is missing or unreadable. The daemon reads the
    power-off with it to time the old job's stop, and the agent to stop the job itself at the
    same instant (docs/checkpoints.md, "The checkpoint window")."""
    action = notice.get("action")
    if action == "rebalance":
        return None
    raw = notice.get("time")
    at: datetime | None = None
    if isinstance(raw, str):
        try:
            at = parse_utc(raw)
        except ValueError:
            at = None
        if at is not None and at.tzinfo is None:
            at = None
    if action == "preempted":
        return (at or noticed_at) + GCP_PREEMPT_WARNING
    return at or noticed_at + DEFAULT_WARNING
