"""The job spec: what to run, under which policy, and where its checkpoints live.

```yaml
apiVersion: gpuopt/v1          # optional
kind: Job                      # optional
name: train-resnet             # [a-z0-9-], unique among jobs
policy: resnet50-training      # a loaded policy's name (optional with `resources`)
resources: {gpu: T4, market: spot}  # optional: inline resources over the default policy
run: python train.py --epochs 90   # at most 64 KiB
setup: pip install -r requirements.txt     # optional, runs before `run` on every attempt
workdir: /srv/train            # optional: where `setup` and `run` start
checkpoint:                    # where checkpoints live between attempts (docs/checkpoints.md)
  uri: s3://team-ckpt/resnet   # s3://bucket[/prefix], gs://bucket[/prefix] or file:///abs/path
  keep: 3                      # optional: the newest checkpoints kept (1..100)
  region: us-east-1            # optional: the bucket's region (the daemon asks the bucket)
# or `checkpoint: s3://team-ckpt/resnet`, or instead of `checkpoint`, a folder the job's
# attempts share: `checkpoint_dir: /mnt/shared/resnet` (handed as GPUOPT_CHECKPOINT_DIR).
code: {sha256: 3f2a…, size: 48213}   # set by `gpuopt jobs submit` after uploading the folder
env: {WANDB_PROJECT: resnet}   # at most 256 variables; no NUL bytes (nor in run/setup/workdir)
probes: quick                  # quick | deep | none
max_restarts: 20               # optional; the policy's recovery.max_restarts otherwise
checkpoint_allowance_s: 20     # optional: seconds the job needs to checkpoint after SIGTERM
standby: true                  # optional: a replacement starts the job early (docs/standby.md)
utilization:                   # optional: rules given here replace the policy's, rule by rule
  idle: {below: 0.05, for: 20m, action: stop}
max_duration: 72h              # optional: replaces the policy's max_duration (at most 87600h)
nodes: 2                       # optional: instances launched together (the policy's otherwise)
warm_spare: false              # optional: keep one booted, probed spare instance (docs/daemon.md)
deadline: 48h                  # optional: a time (2026-12-04T18:00:00Z) or a duration after submit
work: 40h                      # optional: the work to do, or {hours: 40, reference: p3.2xlarge}
```

`deadline` and `work` (docs/deadlines.md, "In the daemon"): the daemon keeps a job with a
deadline on spot while its slack allows and moves it to on-demand when it must. A deadline
time carries its zone (`Z` or `+02:00`); a duration counts from the submit. `work` is hours of
running at the `reference` instance type (the type the job runs on when none is named); a
bare number is seconds, as for every duration. A deadline without `work` is accepted: the
job's own progress reports then tell the work left, and until they do the job is only watched
for a missed deadline. `work` without a deadline is refused (nothing would read it).

`resources` (policies/inline.py) is written over a policy: the one `policy` names, else the
daemon's default; a spec with neither `policy` nor `resources` runs under the default policy.
The daemon builds the effective policy at submit (docs/policies.md, "Inline resources").

At most one of `checkpoint` and `checkpoint_dir` is given; a job with neither restarts from
the beginning after an interruption (its plan says so). A `checkpoint` URI is checked here
(`check_uri`): its scheme, a bucket for s3:// and gs://, an absolute path for file://.

Durations are at most ten years (87600h) and no number may be NaN or infinite, as in policies
(optimizer/common/bounds.py): a spec that says otherwise is refused, by the CLI and with a 422
naming the field by `POST /jobs`.

The store keeps a submitted spec as JSON (`stored_form`: durations in seconds, less the name
and policy, which the job's row holds) and every reader gets it back as a `JobSpec`
(`job_spec(job)`), so each default is written once, here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime, timedelta
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from optimizer.clock import parse_utc
from optimizer.common.documents import load_document, parse_document
from optimizer.common.errors import LocatedError
from policies.inline import Resources
from policies.schema import (
    DURATION_PATTERN,
    MIN_WINDOW_S,
    NAME_PATTERN,
    Duration,
    Utilization,
    parse_duration,
)

if TYPE_CHECKING:  # the store is not loaded for reading a spec file (the CLI)
    from optimizer.jobs.context import PassMemo
    from optimizer.store import JobRecord

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
RESERVED_ENV = (
    "GPUOPT_CHECKPOINT_DIR",
    "GPUOPT_CHECKPOINT_URI",
    "GPUOPT_PROGRESS_FILE",
    "GPUOPT_ATTEMPT",
    "GPUOPT_RESTARTS",
    "GPUOPT_JOB",
    "GPUOPT_STANDBY",  # standby start (docs/standby.md)
    "GPUOPT_GO_FILE",
    # A multi-node job's rendezvous (and torchrun's names for it), set by the agent.
    "GPUOPT_NODE_RANK",
    "GPUOPT_NUM_NODES",
    "GPUOPT_MASTER_ADDR",
    "GPUOPT_MASTER_PORT",
)
# Limits past which a spec could never start: a command longer than an exec argument may be,
# or an environment too large to hand to a process.
MAX_RUN_BYTES = 64 * 1024
MAX_ENV_KEYS = 256
ProbeKind = Literal["quick", "deep", "none"]
# The defaults a spec that does not say gets (the readers take them from JobSpec, never again).
DEFAULT_PROBES: ProbeKind = "quick"
DEFAULT_CHECKPOINT_ALLOWANCE_S = 20.0


def _no_nul(value: str) -> str:
    # exec() takes C strings: a NUL byte would cut the value short (or fail the launch).
    if "\0" in value:
        raise ValueError("must not contain a NUL byte")
    return value


_EnvValue = Annotated[str, AfterValidator(_no_nul)]


class JobSpecError(LocatedError):
    """A job spec that cannot be used."""


DEFAULT_CHECKPOINT_KEEP = 3
# Which provider holds a bucket of each scheme (a `file://` folder is this host's).
SCHEME_PROVIDER = {"s3": "aws", "gs": "gcp", "file": "local"}


def check_uri(text: str) -> str:
    """A checkpoint URI in its canonical form (`s3://bucket/prefix`, `gs://bucket/prefix`,
    `file:///abs/path`, no trailing "/"); ValueError naming what is wrong otherwise: the
    storage layer's one parser (`optimizer.storage.parse_uri`, which loads no client)."""
    from optimizer.storage import BadUri, parse_uri

    if any(c.isspace() for c in text):
        raise ValueError(f"{text!r} must not contain spaces")
    try:
        return str(parse_uri(text))
    except BadUri as exc:
        raise ValueError(str(exc)) from None


def bucket_provider(uri: str) -> str:
    """The provider that holds a checkpoint URI's bucket: aws, gcp or local."""
    return SCHEME_PROVIDER.get(uri.partition("://")[0], "unknown")


class CheckpointSpec(BaseModel):
    """Where a job's checkpoints live between attempts: a bucket URI, how many to keep, and
    the bucket's region (filled in by the daemon at submit when not given)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    uri: str = Field(
        min_length=1,
        max_length=1024,
        description="s3://bucket[/prefix], gs://bucket[/prefix] or file:///absolute/path.",
        examples=["s3://team-ckpt/resnet"],
    )
    keep: int = Field(
        DEFAULT_CHECKPOINT_KEEP, ge=1, le=100, description="The newest checkpoints kept."
    )
    region: str | None = Field(
        None,
        min_length=1,
        max_length=64,
        pattern=r"^[a-z0-9-]+$",
        description="The bucket's region (the daemon asks the storage API when not given).",
    )

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        return {"uri": value} if isinstance(value, str) else value

    @field_validator("uri")
    @classmethod
    def _uri(cls, value: str) -> str:
        return check_uri(value)


class CodeRef(BaseModel):
    """The code archive a job runs from (docs/code.md): its SHA-256 and size in bytes. The
    CLI packs and uploads the folder and fills this in; `workdir` is then relative to the
    archive's root."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="64 lowercase hex digits.")
    size: int = Field(ge=0, le=1 << 40, description="The archive's size in bytes.")


def _deadline(value: Any) -> Any:
    """`48h` (a duration after submit) → seconds; an ISO 8601 time with its zone → a
    datetime (YAML hands an unquoted time over as one already)."""
    if isinstance(value, str) and not re.fullmatch(DURATION_PATTERN, value):
        try:
            value = parse_utc(value.strip())
        except ValueError:
            raise ValueError(
                f"{value!r} is neither a duration (48h, 30m) nor an ISO 8601 time "
                "(2026-12-04T18:00:00Z)"
            ) from None
    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError(f"{value.isoformat()} has no time zone: write Z or an offset (+02:00)")
        return value
    seconds = parse_duration(value)
    if isinstance(seconds, float) and not seconds > 0:
        raise ValueError("a deadline after submit must be above 0")
    return seconds


Deadline = Annotated[datetime | float, BeforeValidator(_deadline)]


class WorkSpec(BaseModel):
    """The work a job has to do: hours of running at a reference instance type."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    hours: float = Field(gt=0, le=87600, description="Hours of running at the reference type.")
    reference: str | None = Field(
        None,
        min_length=1,
        max_length=64,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        description="The instance type the hours are measured on (default: the one it runs on).",
        examples=["p3.2xlarge"],
    )

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        # `work: 48h` (or a number of seconds, as every duration): hours at no named type.
        if isinstance(value, str | int | float) and not isinstance(value, bool):
            seconds = parse_duration(value)
            if not isinstance(seconds, float):
                return value
            return {"hours": seconds / 3600}
        return value

    @property
    def seconds(self) -> float:
        return self.hours * 3600


class JobSpec(BaseModel):
    model_config = ConfigDict(
        extra="forbid", frozen=True, strict=True, allow_inf_nan=False, populate_by_name=True
    )

    api_version: Literal["gpuopt/v1"] = Field("gpuopt/v1", alias="apiVersion")
    kind: Literal["Job"] = "Job"
    name: str = Field(pattern=NAME_PATTERN, description="[a-z0-9-], unique among jobs.")
    policy: str | None = Field(
        None,
        pattern=NAME_PATTERN,
        description="The policy the job runs under; with `resources`, the one they are "
        "written over (default: the daemon's default policy).",
    )
    resources: Resources | None = Field(
        None,
        description="Inline resources written over the policy (policies/inline.py).",
        examples=[{"gpu": "T4", "market": "spot", "regions": ["eu-*"]}],
    )
    run: str = Field(min_length=1, description="The command, run with /bin/sh -c.")
    setup: str | None = Field(None, description="Runs before `run` on every attempt.")
    workdir: str | None = Field(
        None,
        description="Where the commands run on the instance; with `code`, a folder inside "
        "the archive (relative).",
    )
    code: CodeRef | None = Field(
        None,
        description="The uploaded code archive the commands run in (set by the CLI).",
        examples=[{"sha256": "3f2a" * 16, "size": 48213}],
    )
    checkpoint: CheckpointSpec | None = Field(
        None,
        description="The bucket the job's checkpoints are synced to (a URI, or uri/keep/region).",
        examples=["s3://team-ckpt/resnet", {"uri": "gs://team-ckpt/resnet", "keep": 5}],
    )
    checkpoint_dir: str | None = Field(
        None, min_length=1, description="A path or URI the job's attempts share themselves."
    )
    env: dict[str, _EnvValue] = Field(
        default_factory=dict,
        description=f"At most {MAX_ENV_KEYS} variables.",
        examples=[{"WANDB_PROJECT": "resnet"}],
    )
    probes: ProbeKind = DEFAULT_PROBES
    expected_gpus: int | None = Field(
        None, ge=0, le=64, description="GPUs the probe must find (default: the offer's)."
    )
    max_restarts: int | None = Field(None, ge=0, le=1000)
    checkpoint_allowance_s: float = Field(
        DEFAULT_CHECKPOINT_ALLOWANCE_S,
        gt=0,
        le=3600,
        description="How long the job needs to checkpoint after SIGTERM: after an "
        "interruption notice it is stopped at the latest this long before the power-off.",
    )
    standby: bool = Field(
        False,
        description="The job waits for the go (optimizer.standby.wait_for_go) before it "
        "loads its checkpoint: a replacement's agent may then start it while the old "
        "attempt's job still runs, and gives the go once that one has ended.",
    )
    utilization: Utilization | None = Field(
        None,
        description="Utilization rules; each one given replaces the policy's rule of its name.",
        examples=[{"idle": {"below": 0.05, "for": "20m", "action": "stop"}}],
    )
    max_duration: Duration | None = Field(
        None,
        ge=MIN_WINDOW_S,
        description="Stop the job (with a checkpoint) this long after it first started.",
    )

    nodes: int | None = Field(
        None,
        ge=1,
        le=64,
        description="Instances the job spans, launched and replaced together (default: the "
        "policy's workload.nodes, else 1).",
    )

    warm_spare: bool = Field(
        False,
        description="Keep one extra instance booted, registered and probed beside the running "
        "attempt, which takes the job over at once when that one is interrupted (billed).",
    )

    deadline: Deadline | None = Field(
        None,
        description="When the job must be done: an ISO 8601 time with its zone, or a duration "
        "after submit.",
        examples=["48h", "2026-12-04T18:00:00Z"],
    )
    work: WorkSpec | None = Field(
        None,
        description="The work to do: a duration (hours at the type it runs on), or hours at "
        "a reference instance type.",
        examples=["48h", {"hours": 48, "reference": "p3.2xlarge"}],
    )

    @model_validator(mode="after")
    def _work_needs_deadline(self) -> JobSpec:
        if self.work is not None and self.deadline is None:
            raise ValueError("`work` is read only with a `deadline`: give one, or drop `work`")
        return self

    def deadline_at(self, submitted: datetime) -> datetime | None:
        """The deadline as a time, for a job submitted at `submitted`."""
        if self.deadline is None:
            return None
        if isinstance(self.deadline, datetime):
            return self.deadline
        return submitted + timedelta(seconds=self.deadline)

    @field_validator("warm_spare")
    @classmethod
    def _spare_of_one_node(cls, value: bool, info: ValidationInfo) -> bool:
        nodes = info.data.get("nodes")
        if value and nodes is not None and nodes > 1:
            raise ValueError(
                f"a warm spare is one instance: a job of {nodes} nodes cannot have one"
            )
        return value

    @field_validator("run", "checkpoint_dir")
    @classmethod
    def _not_blank(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("must not be blank")
        return value

    @field_validator("checkpoint_dir")
    @classmethod
    def _not_both(cls, value: str | None, info: ValidationInfo) -> str | None:
        # `checkpoint` is validated first (field order), so a spec with both is refused here,
        # located at `checkpoint_dir`.
        if value is not None and info.data.get("checkpoint") is not None:
            raise ValueError("give either `checkpoint` or `checkpoint_dir`, not both")
        return value

    @property
    def inline(self) -> bool:
        """Whether the job runs under an effective policy the daemon builds (resources
        written over a policy, or no policy named): not a loaded policy as it is."""
        return self.resources is not None or self.policy is None

    @property
    def restarts_from_beginning(self) -> bool:
        """No checkpoint place: an interrupted attempt's successor starts over."""
        return self.checkpoint is None and self.checkpoint_dir is None

    @field_validator("run", "setup", "workdir")
    @classmethod
    def _no_nul_in_commands(cls, value: str | None) -> str | None:
        return None if value is None else _no_nul(value)

    @field_validator("run")
    @classmethod
    def _run_size(cls, value: str) -> str:
        size = len(value.encode())
        if size > MAX_RUN_BYTES:
            raise ValueError(f"is {size} bytes; at most {MAX_RUN_BYTES} (64 KiB) are allowed")
        return value

    @model_validator(mode="after")
    def _workdir_in_code(self) -> JobSpec:
        if self.code is not None and self.workdir is not None:
            path = PurePosixPath(self.workdir)
            if path.is_absolute() or ".." in path.parts:
                raise ValueError(
                    f"workdir {self.workdir!r}: with code, it is a folder inside the archive "
                    "(a relative path without '..')"
                )
        return self

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        if len(value) > MAX_ENV_KEYS:
            raise ValueError(f"has {len(value)} variables; at most {MAX_ENV_KEYS} are allowed")
        for name in value:
            if not _ENV_NAME.fullmatch(name):
                raise ValueError(f"{name!r} is not an environment variable name")
            if name in RESERVED_ENV:
                raise ValueError(f"{name} is set by gpuopt; choose another name")
        return value


def parse_job_spec(text: str | bytes, *, path: str = "<job>") -> JobSpec:
    return parse_document(
        text, JobSpec, path=path, interpolate=True, what="job spec", error=JobSpecError
    )


def load_job_spec(path: str | Path) -> JobSpec:
    return load_document(path, JobSpec, interpolate=True, what="job spec", error=JobSpecError)


# What the job's row holds itself, so the stored spec leaves it out.
ROW_FIELDS = frozenset({"api_version", "kind", "name", "policy"})


def stored_form(spec: JobSpec) -> dict[str, Any]:
    """What the store keeps of a submitted spec: its JSON (durations in seconds), less the
    fields the job's row holds (and the resources not given)."""
    out = spec.model_dump(mode="json", exclude=set(ROW_FIELDS))
    if out.get("resources") is not None:
        out["resources"] = {k: v for k, v in out["resources"].items() if v is not None}
    return out


def from_stored(stored: Mapping[str, Any], *, name: str, policy: str) -> JobSpec:
    """A stored spec read back, its defaults filled in. Tolerant of what an earlier version
    stored: keys no longer known are ignored, a field that no longer passes reads as its
    default, and should a field without a default not pass, the spec is taken as stored,
    unchecked (a job already accepted is never refused on reading)."""
    data = {k: v for k, v in stored.items() if k in JobSpec.model_fields and k not in ROW_FIELDS}
    data.update(name=name, policy=policy)
    try:
        return JobSpec.model_validate(data, strict=False)
    except ValidationError as exc:
        bad = {str(e["loc"][0]) for e in exc.errors() if e["loc"]}
    optional = {k for k in bad if not JobSpec.model_fields[k].is_required()}
    kept = {k: v for k, v in data.items() if k not in optional}
    try:
        return JobSpec.model_validate(kept, strict=False)
    except ValidationError:
        return JobSpec.model_construct(**kept)


def job_spec(job: JobRecord) -> JobSpec:
    """A stored job's spec, as a `JobSpec`."""
    return from_stored(job.spec, name=job.given_name, policy=job.policy)


def pass_spec(job: JobRecord, memo: PassMemo | None) -> JobSpec:
    """`job_spec(job)`, validated once per reconcile pass where the pass's memo is given: a
    pass holds one record of each job, and a stored spec never changes."""
    if memo is None:
        return job_spec(job)
    return memo.get(("job_spec", job.id), lambda: job_spec(job))
