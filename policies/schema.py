"""The v1 policy file, as pydantic models: unknown keys, wrong types and bad values are errors.

Every model is frozen and forbids extra keys, so a typo (`max_usd_per_hr`) is caught before
anything runs. `policy.schema.json` is generated from these models (`gpuopt policy schema`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from enum import StrEnum
from fnmatch import fnmatchcase
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)
from pydantic.json_schema import WithJsonSchema
from pydantic_core import PydanticCustomError, ValidationError

from optimizer import hardware
from optimizer.common import plugins
from optimizer.common.bounds import (
    MAX_DURATION_H,
    MAX_DURATION_S,
    Count,
    Hours,
    Minutes,
    Tflops,
    Usd,
)
from policies import regions, sizing, windows

API_VERSION = "gpuopt/v1"
NAME_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
DTYPES = hardware.DTYPES
Dtype = Literal["fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "int8"]
Market = Literal["spot", "on_demand", "committed", "owned"]
# How candidates are ordered; expected_cost is applied after the engine's rules
# (optimizer/jobs/expected.py), the engine itself orders those by price; price_per_step too,
# with the job's measured speeds (policies/per_step.py), the engine orders those per TFLOP.
RankBy = Literal["price", "price_per_tflop", "price_per_tbps", "expected_cost", "price_per_step"]
Day = Literal["mon", "tue", "wed", "thu", "fri", "sat", "sun"]


def _installed_providers() -> tuple[str, ...]:
    """The providers installed here (the `gpuopt.providers` entry points, and any registered
    in this process): read when a policy is loaded, never baked into the schema."""
    return plugins.names(plugins.PROVIDERS)


def _known_provider(name: str) -> str:
    known = _installed_providers()
    if name not in known:
        quoted = [repr(p) for p in known] or ["none is installed"]
        listed = f"{', '.join(quoted[:-1])} or {quoted[-1]}" if len(quoted) > 1 else quoted[0]
        raise ValueError(f"must be an installed provider: {listed}")
    return name


# A provider a policy may name: an installed one (providers/registry.py). The published
# schema says a name; the loader checks it against what is installed where it runs.
ProviderName = Annotated[
    str,
    AfterValidator(_known_provider),
    WithJsonSchema(
        {
            "type": "string",
            "pattern": "^[a-z][a-z0-9-]{0,31}$",
            "description": "An installed provider (local, aws and gcp are built in).",
        }
    ),
]


def _all_providers() -> list[str]:
    return list(_installed_providers())


def _all_markets() -> list[Market]:
    # Owned machines are allowed by default (a team that registered machines wants them used),
    # listed last so that they rank by price like the rest unless a policy puts them first.
    return ["spot", "on_demand", "owned"]


class RecoveryStrategy(StrEnum):
    """The built-in recovery strategies (each implemented once in optimizer/jobs/recovery.py,
    under this name); a policy may name any installed one (`recovery_strategies`)."""

    FAILOVER = "failover"
    EAGER_ON_DEMAND = "eager-on-demand"


def recovery_strategies() -> tuple[str, ...]:
    """The recovery strategies installed here (the `gpuopt.recovery_strategies` entry points,
    optimizer/jobs/recovery.py, and any registered in this process), by name: read when a
    policy is loaded, never baked into the schema."""
    return plugins.names(plugins.RECOVERY_STRATEGIES)


assert set(Dtype.__args__) == set(DTYPES), "Dtype must list the hardware table's dtypes"  # type: ignore[attr-defined]


FabricNeed = Literal["any", "fast", "efa", "gpudirect-tcpx", "gpudirect-tcpxo", "gpudirect-rdma"]


class _Strict(BaseModel):
    # allow_inf_nan=False: NaN and infinity are never a number a policy means.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class ModelSpec(_Strict):
    """A model to derive GPU memory from (policies/sizing.py has the formulas)."""

    parameters: int | float | str = Field(
        description="Parameter count: a number or 340M / 7B / 1.5T."
    )
    precision: str = Field("bf16", description="fp32, tf32, bf16, fp16, fp8, int8, int4.")
    optimizer: str = Field("adam", description="adam, adamw, sgd, adafactor or none.")

    @field_validator("parameters")
    @classmethod
    def _parameters(cls, value: int | float | str) -> int:
        return sizing.parse_parameters(value)

    @field_validator("precision")
    @classmethod
    def _precision(cls, value: str) -> str:
        return sizing.canonical_precision(value)

    @field_validator("optimizer")
    @classmethod
    def _optimizer(cls, value: str) -> str:
        return sizing.canonical_optimizer(value)


class Workload(_Strict):
    """What the work needs, before the buffer."""

    type: Literal["training", "inference", "hpc", "rendering"] = "training"
    gpus: int = Field(1, ge=1, le=64, description="GPUs per node, minimum.")
    gpu_memory_gib: float | None = Field(
        None, gt=0, le=4096, description="Per-GPU memory needed before the buffer, GiB."
    )
    model: ModelSpec | None = Field(
        None,
        description="Derive per-GPU memory from a model; with gpu_memory_gib the larger wins.",
        examples=[{"parameters": "7B", "precision": "bf16", "optimizer": "adamw"}],
    )
    min_tflops: dict[Dtype, Tflops] = Field(
        default_factory=dict,
        description="Whole-node dense TFLOPS per dtype, before the buffer.",
        examples=[{"bf16": 100}],
    )
    fp64: bool = Field(False, description="Needs real FP64 units (>= 5 TFLOPS per GPU).")
    interconnect: Literal["any", "nvlink"] = "any"
    nodes: int = Field(
        1, ge=1, le=64, description="Instances the work spans, launched together (a gang)."
    )
    fabric: FabricNeed = Field(
        "any",
        description="The network between the nodes: any, fast (any inter-node GPU fabric), "
        "efa, gpudirect-tcpx, gpudirect-tcpxo or gpudirect-rdma.",
    )
    gpu_models: list[str] = Field(
        default_factory=list,
        description="Only these GPU models (canonical names or aliases).",
        examples=[["A100-80GB", "H100-80GB"]],
    )
    cpu_memory_gib: float = Field(0, ge=0, le=1 << 16, description="Host RAM per node, GiB.")
    vcpus: Count = Field(0, ge=0, description="vCPUs per node.")

    @field_validator("min_tflops")
    @classmethod
    def _positive_tflops(cls, value: dict[str, float]) -> dict[str, float]:
        for dtype, tflops in value.items():
            if tflops <= 0:
                raise ValueError(f"min_tflops.{dtype} must be > 0, got {tflops}")
        return value

    @field_validator("gpu_models")
    @classmethod
    def _known_gpus(cls, value: list[str]) -> list[str]:
        names: list[str] = []
        for raw in value:
            spec = hardware.lookup(raw)
            if spec is None:
                known = ", ".join(g.name for g in hardware.all_gpus())
                raise ValueError(f"unknown GPU model {raw!r}; known models: {known}")
            if spec.name not in names:
                names.append(spec.name)
        return names

    @model_validator(mode="after")
    def _sizable(self) -> Workload:
        if self.model is not None:
            if self.type not in ("training", "inference"):
                raise ValueError(f"model sizing applies to training and inference, not {self.type}")
            if self.type == "training" and self.model.precision not in sizing.TRAINING_PRECISIONS:
                raise ValueError(
                    f"precision {self.model.precision} cannot size training; use one of: "
                    + ", ".join(sizing.TRAINING_PRECISIONS)
                )
        return self

    def memory_estimate(self) -> sizing.Estimate | None:
        if self.model is None:
            return None
        return sizing.estimate(
            self.model.parameters, self.model.precision, self.type, self.model.optimizer, self.gpus
        )

    def gpu_memory_need_gib(self) -> float:
        """Per-GPU memory needed before the buffer: the explicit figure or the model's."""
        estimate = self.memory_estimate()
        derived = estimate.per_gpu_gib if estimate else 0.0
        return max(float(self.gpu_memory_gib or 0.0), derived)

    def dtype(self) -> str:
        """The dtype that ranks throughput: the first min_tflops key, else the model's."""
        if self.min_tflops:
            return next(iter(self.min_tflops))
        if self.model is not None and self.model.precision in DTYPES:
            return self.model.precision
        if self.type == "hpc" or self.fp64:
            return "fp64"
        return "bf16"


class Bid(_Strict):
    """Price caps; each optional."""

    max_usd_per_hour: Usd | None = Field(None, gt=0, description="Whole instance, USD/h.")
    max_usd_per_gpu_hour: Usd | None = Field(None, gt=0, description="USD per GPU-hour.")
    max_fraction_of_on_demand: float | None = Field(
        None,
        gt=0,
        le=1,
        description="Spot only: spot price <= this x on-demand of the same type and region.",
    )
    enforce_in_cloud: bool = Field(
        False,
        description=(
            "Also send the instance cap (max_usd_per_hour, max_usd_per_gpu_hour x GPUs) with "
            "each spot launch, so the cloud stops the instance when the spot price passes it "
            "(AWS MaxPrice; GCP has no spot maximum price: its launch checks the quoted price)."
        ),
    )


# A zone's name, which a region list does not take: AWS `us-east-1a` (and Local Zones
# `us-east-1-bos-1a`), GCP `europe-west4-a`.
_ZONE = re.compile(r"[a-z]{2}(-[a-z]+)+-\d+(-[a-z]+-\d+)?[a-z]|[a-z]+-[a-z]+\d+-[a-z]")


def region_glob(glob: str) -> str:
    """The glob unchanged; raises naming it when it is empty, not a region glob (a malformed
    one: an unclosed `[`), a zone's name, or one that matches no region gpuopt knows (the
    bundled region table: regions are lower case, and `*` alone is every region)."""
    known = [r.name for r in regions.all_regions()]  # each item checked (and located) alone
    if not glob.strip():
        raise ValueError("a region glob must not be empty")
    if not re.fullmatch(r"[A-Za-z0-9*?\[\]!-]+", glob):
        raise ValueError(f"{glob!r} is not a region glob (letters, digits, -, *, ?, [])")
    if not re.fullmatch(r"([^\[\]]|\[!?[^\[\]]+\])*", glob):
        raise ValueError(f"{glob!r} is not a region glob: a [ without its ] (or an empty [])")
    if _ZONE.fullmatch(glob):
        region = glob[:-1] if glob[-2].isdigit() else glob[:-2]
        raise ValueError(f"{glob!r} is a zone; a region list takes regions ({region})")
    if not any(fnmatchcase(name, glob) for name in known):
        lower = glob.lower()
        hint = (
            f" (globs are case-sensitive: {lower}?)"
            if lower != glob and any(fnmatchcase(n, lower) for n in known)
            else " (AWS and GCP regions, e.g. eu-west-1, europe-west4)"
        )
        raise ValueError(f"{glob!r} matches no region gpuopt knows{hint}")
    return glob


RegionGlob = Annotated[str, AfterValidator(region_glob)]


class RegionRules(_Strict):
    allow: list[RegionGlob] = Field(
        default_factory=lambda: ["*"], min_length=1, examples=[["eu-*"]]
    )
    deny: list[RegionGlob] = Field(default_factory=list, examples=[["eu-south-*"]])


class Placement(_Strict):
    providers: list[ProviderName] = Field(
        default_factory=_all_providers, min_length=1, examples=[["aws", "gcp"]]
    )
    regions: RegionRules = Field(
        default_factory=RegionRules,
        description="Region globs: allow (default every region), then deny.",
        examples=[{"allow": ["eu-*", "europe-*"], "deny": ["eu-south-*"]}],
    )
    compliance: str | None = Field(
        None, description="eu (alias gdpr) = EU/EEA member states only; us, uk, ch; or null."
    )
    countries: list[str] = Field(
        default_factory=list,
        description="ISO 3166-1 alpha-2 codes the region must be in.",
        examples=[["DE", "FR"]],
    )

    @field_validator("compliance")
    @classmethod
    def _preset(cls, value: str | None) -> str | None:
        return None if value is None else regions.resolve_preset(value)

    @field_validator("countries")
    @classmethod
    def _countries(cls, value: list[str]) -> list[str]:
        return regions.validate_countries(value)


class DataRegions(_Strict):
    allow: list[RegionGlob] = Field(
        default_factory=lambda: ["*"],
        min_length=1,
        description="Region globs the job's state may be moved to (default every region).",
        examples=[["eu-*", "europe-*"]],
    )

    def allows(self, region: str) -> bool:
        """Whether `region` matches one of the globs (the rule data.regions reads the same)."""
        return allowed_region(self.allow, region)


def allowed_region(globs: Iterable[str], region: str) -> bool:
    """Whether `region` matches one of the region globs."""
    return any(fnmatchcase(region, glob) for glob in globs)


class Data(_Strict):
    """Where a job's state (its checkpoint in object storage) may go, and at what cost. Only
    a job with state in a known place is held to it (docs/policies.md, "data")."""

    max_move_usd: Usd | None = Field(
        None,
        ge=0,
        description="Reject an offer whose move of the job's state (egress plus the "
        "restore's time at the offer's price) costs more than this, USD.",
    )
    regions: DataRegions = Field(
        default_factory=DataRegions,
        description="Region globs the job's state may be moved to.",
        examples=[{"allow": ["eu-*", "europe-*"]}],
    )


class Budget(_Strict):
    monthly_usd: Usd | None = Field(None, gt=0, description="Spend cap per month, USD.")
    hours_per_month: float | None = Field(
        None,
        gt=0,
        le=744,
        description=(
            "At most this many more hours a live or new attempt is projected to run this "
            "month (work that runs part-time); null: to the end of the month."
        ),
    )


class Recovery(_Strict):
    """Where a job goes after an interruption, a failed probe or a failed launch: a named
    strategy (optimizer/jobs/recovery.py) and its settings."""

    strategy: str = Field(
        RecoveryStrategy.FAILOVER.value,
        description=(
            "The recovery strategy: an installed one (failover, the default, and "
            "eager-on-demand are built in)."
        ),
    )
    max_restarts: Count = Field(20, ge=0, description="Relaunches before the job fails.")
    pool_cooldown_minutes: Minutes = Field(
        10,
        ge=0,
        description="Minutes a pool sits out after it failed an attempt or had no capacity.",
    )
    on_demand_after_interruptions: Count = Field(
        3,
        ge=0,
        description="Interruptions within the window that move a job to on-demand; 0: never.",
    )
    on_demand_window_minutes: Minutes = Field(
        60,
        gt=0,
        description="Minutes in which interruptions count; the on-demand fallback lasts as long.",
    )
    quota_cooldown_minutes: Minutes = Field(
        60, ge=0, description="Minutes a pool sits out after a launch hit a quota."
    )
    auth_cooldown_minutes: Minutes = Field(
        60, ge=0, description="Minutes a provider sits out after it refused our credentials."
    )
    deadline_strategy: str = Field(
        "gpuopt",
        description="The deadline strategy a job with a `deadline` is run by "
        "(policies/deadline; docs/deadlines.md).",
    )
    restart_overhead: Duration = Field(
        600.0,
        ge=0,
        description="What one restart costs a job with a deadline (start-up and lost work) "
        "until its own restarts have been measured.",
    )

    @field_validator("deadline_strategy")
    @classmethod
    def _known_deadline_strategy(cls, value: str) -> str:
        from policies.deadline import STRATEGIES

        if value not in STRATEGIES:
            raise ValueError(f"unknown deadline strategy {value!r}; known: {', '.join(STRATEGIES)}")
        return value

    @field_validator("strategy")
    @classmethod
    def _known_strategy(cls, value: str) -> str:
        known = recovery_strategies()
        if value not in known:
            listed = ", ".join(known) or "none is installed"
            raise ValueError(f"unknown recovery strategy {value!r}; installed: {listed}")
        return value


# Durations: a number with a unit, `s`, `m` or `h` (`90s`, `30m`, `72h`); a bare number is
# seconds (what a stored spec holds). Windows as short as 10 s keep drills quick; ten years
# (87600h, optimizer/common/bounds.py) is the longest, so a time plus a duration always fits
# in a datetime.
DURATION_PATTERN = r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(s|m|h)\s*$"
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}
MIN_WINDOW_S = 10.0
MAX_DURATION_TEXT = f"{MAX_DURATION_H}h (10 years)"


def parse_duration(value: Any) -> Any:
    """`30m` → 1800.0 (seconds); a number passes as seconds; anything else is left for the
    field's own check to reject. NaN, infinity and anything longer than ten years are
    refused here, before a number too large for a float reaches one."""
    if isinstance(value, str):
        match = re.fullmatch(DURATION_PATTERN, value)
        if match is None:
            raise ValueError(f"{value!r} is not a duration: write a number and s, m or h (30m)")
        seconds = float(match.group(1)) * _UNITS[match.group(2)]
    elif isinstance(value, int) and not isinstance(value, bool):
        # Compared as integers: 10**4000 is no float.
        if value > MAX_DURATION_S:
            raise ValueError(f"must be at most {MAX_DURATION_TEXT}")
        if value < 0:
            raise ValueError("must not be negative")
        return float(value)
    elif isinstance(value, float):
        if math.isnan(value):
            raise ValueError("must be a finite number")
        seconds = value
    else:
        return value
    if not seconds <= MAX_DURATION_S:
        raise ValueError(f"must be at most {MAX_DURATION_TEXT}")
    return seconds


Duration = Annotated[
    float,
    BeforeValidator(parse_duration),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "pattern": DURATION_PATTERN},
                {"type": "number", "description": "seconds", "maximum": MAX_DURATION_S},
            ]
        }
    ),
]


class UtilizationRule(_Strict):
    """A rule on a running job's GPU utilization: when every per-minute reading over the last
    `for` was below `below` (docs/policies.md, Utilization), raise an alert or stop the job."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        strict=True,
        allow_inf_nan=False,
        populate_by_name=True,
        serialize_by_alias=True,
    )

    below: float = Field(gt=0, le=1, description="Utilization threshold, 0 < below <= 1.")
    for_: Duration = Field(
        alias="for",
        ge=MIN_WINDOW_S,
        description="How long it must stay below: 10s, 30m, 2h (at least 10 s).",
    )
    action: Literal["alert", "stop"] = Field(
        "alert", description="alert: an alert once per window; stop: checkpoint and stop."
    )


class Utilization(_Strict):
    """Rules on a running job's GPU utilization; each optional."""

    low: UtilizationRule | None = Field(
        None,
        description="Work that underuses its GPU (the guide's 60% floor): usually alert.",
        examples=[{"below": 0.6, "for": "30m", "action": "alert"}],
    )
    idle: UtilizationRule | None = Field(
        None,
        description="A GPU left idle: usually stop.",
        examples=[{"below": 0.05, "for": "20m", "action": "stop"}],
    )


class Migration(_Strict):
    """Moving running jobs to better capacity through a checkpoint (docs/policies.md,
    Migration): when their price passes the bid cap, the policy stops allowing their pool, spot
    is back after an on-demand fallback, or an offer is much cheaper for long enough."""

    enabled: bool = Field(False, description="Move running jobs (off unless set).")
    min_savings: float = Field(
        0.25, gt=0, lt=1, description="A cheaper offer must cost this fraction less, 0..1."
    )
    min_stable: Duration = Field(
        1800, ge=0, description="… for at least this long (30m) before a job moves to it."
    )
    return_to_spot_after: Duration = Field(
        1800,
        ge=0,
        description="A job on on-demand returns to spot once an allowed spot offer has been "
        "available this long (30m).",
    )
    max_per_day: Count = Field(4, ge=1, description="Moves per job in any 24 hours.")
    min_runtime: Duration = Field(
        600, ge=0, description="A job moves only once its attempt has run this long."
    )
    disruption_budget: Count = Field(
        1, ge=1, description="At most this many of the policy's jobs moving at once."
    )


def _every_day() -> list[Day]:
    return ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]


def _unique(value: list[str], what: str) -> list[str]:
    if len(set(value)) != len(value):
        raise ValueError(f"{what} lists a value twice")
    return value


# The keys a window may set; each replaces the policy's own value of that key while the
# window is in force (policies/schedule.py).
WINDOW_KEYS = ("markets", "bid", "placement", "rank_by")


class Window(_Strict):
    """Hours on some days of the week in which some of the policy's keys take other values."""

    name: str = Field(pattern=NAME_PATTERN, description="[a-z0-9-], unique in the schedule.")
    days: list[Day] = Field(
        default_factory=_every_day,
        min_length=1,
        description="The days the window starts on (a window across midnight ends the next day).",
        examples=[["mon", "tue", "wed", "thu", "fri"]],
    )
    hours: str = Field(
        description="HH:MM-HH:MM, local time; 22:00-06:00 crosses midnight, 00:00-24:00 is "
        "the whole day.",
        json_schema_extra={"pattern": windows.HOURS_PATTERN},
    )
    markets: list[Market] | None = Field(
        None, min_length=1, description="Markets in force in the window.", examples=[["on_demand"]]
    )
    bid: Bid | None = Field(
        None, description="Bid caps in force in the window.", examples=[{"max_usd_per_hour": 40}]
    )
    placement: Placement | None = Field(
        None,
        description="Placement in force in the window.",
        examples=[{"regions": {"allow": ["eu-*", "europe-*"]}}],
    )
    rank_by: RankBy | None = Field(None, description="Ranking in force in the window.")

    @field_validator("days")
    @classmethod
    def _unique_days(cls, value: list[str]) -> list[str]:
        return _unique(value, "days")

    @field_validator("markets")
    @classmethod
    def _unique_markets(cls, value: list[str] | None) -> list[str] | None:
        return None if value is None else _unique(value, "markets")

    @field_validator("hours")
    @classmethod
    def _hours(cls, value: str) -> str:
        return str(windows.parse_hours(value))

    def parsed_hours(self) -> windows.Hours:
        return windows.parse_hours(self.hours)

    def overrides(self) -> dict[str, Any]:
        """The keys this window sets, with their values."""
        return {k: getattr(self, k) for k in WINDOW_KEYS if getattr(self, k) is not None}


class Schedule(_Strict):
    """Time windows in one time zone; outside every window the policy's own values apply."""

    timezone: str = Field(
        description="IANA time zone the hours are in (Europe/Berlin); summer time is followed.",
        examples=["Europe/Berlin"],
    )
    windows: list[Window] = Field(
        min_length=1,
        description="Windows that never overlap.",
        examples=[
            [
                {
                    "name": "office-hours",
                    "days": ["mon", "tue", "wed", "thu", "fri"],
                    "hours": "09:00-18:00",
                    "markets": ["on_demand"],
                }
            ]
        ],
    )

    @field_validator("timezone")
    @classmethod
    def _zone(cls, value: str) -> str:
        windows.zone(value)
        return value

    @field_validator("windows")
    @classmethod
    def _apart(cls, value: list[Window]) -> list[Window]:
        """Names unique, and no two windows share a minute of the week; a problem is located
        at the later window's field (ValidationError line errors nest under this field)."""
        seen: dict[str, int] = {}
        spans = [windows.weekly_spans(w.days, w.parsed_hours()) for w in value]
        for i, window in enumerate(value):
            if window.name in seen:
                raise _located(
                    (i, "name"),
                    "window_name",
                    f"window name {window.name!r} is already used by windows[{seen[window.name]}]",
                    window.name,
                )
            seen[window.name] = i
            for j in range(i):
                met = windows.first_overlap(spans[j], spans[i])
                if met is not None:
                    raise _located(
                        (i, "hours"),
                        "window_overlap",
                        f"window {window.name!r} overlaps window {value[j].name!r} "
                        f"(windows[{j}]): {windows.describe_span(met[1])} meets "
                        f"{windows.describe_span(met[0])}; windows may not overlap",
                        window.hours,
                    )
        return value

    def window(self, name: str) -> Window | None:
        return next((w for w in self.windows if w.name == name), None)


def _located(loc: tuple[str | int, ...], kind: str, message: str, value: Any) -> ValidationError:
    """A validation error at `loc` below the field whose validator raises it."""
    return ValidationError.from_exception_data(
        "Schedule",
        [{"type": PydanticCustomError(kind, message), "loc": loc, "input": value}],  # type: ignore[list-item]
    )


class Policy(_Strict):
    """One policy file (apiVersion gpuopt/v1, kind Policy)."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        strict=True,
        allow_inf_nan=False,
        populate_by_name=True,
        json_schema_extra={"title": "gpuopt policy (gpuopt/v1)"},
    )

    api_version: Literal["gpuopt/v1"] = Field(alias="apiVersion")
    kind: Literal["Policy"]
    name: str = Field(pattern=NAME_PATTERN, description="[a-z0-9-], unique.")
    description: str = ""
    workload: Workload = Field(
        default_factory=Workload, examples=[{"type": "training", "gpus": 1, "gpu_memory_gib": 24}]
    )
    buffer: float = Field(
        0.20, ge=0, lt=1, description="Headroom on memory and throughput, 0 <= buffer < 1."
    )
    markets: list[Market] = Field(
        default_factory=_all_markets,
        min_length=1,
        description="Allowed markets, in order of preference (breaks price ties). `owned` listed "
        "before every other market is stronger: an owned offer passing every rule ranks ahead "
        "of every cloud offer (own first, then the rest by price).",
        examples=[["spot", "on_demand"]],
    )
    rank_by: RankBy = Field(
        "price",
        description="price | price_per_tflop | price_per_tbps | expected_cost (price grown "
        "by the pool's interruption risk times the job's restart overhead) | price_per_step "
        "(price over the job's measured steps per hour on the type, else scaled by probe, "
        "then datasheet TFLOPS).",
    )
    max_price_age_hours: Hours | None = Field(
        None, gt=0, description="Reject prices observed longer ago than this."
    )
    bid: Bid = Field(default_factory=Bid, examples=[{"max_usd_per_gpu_hour": 2.5}])
    placement: Placement = Field(
        default_factory=Placement,
        examples=[{"providers": ["aws", "gcp"], "regions": {"allow": ["eu-*", "europe-*"]}}],
    )
    budget: Budget = Field(default_factory=Budget, examples=[{"monthly_usd": 5000}])
    recovery: Recovery = Field(
        default_factory=Recovery,
        examples=[{"strategy": RecoveryStrategy.FAILOVER.value, "max_restarts": 20}],
    )
    utilization: Utilization = Field(
        default_factory=Utilization,
        description="Alert on or stop running jobs whose GPU utilization stays low.",
        examples=[{"idle": {"below": 0.05, "for": "20m", "action": "stop"}}],
    )
    max_duration: Duration | None = Field(
        None,
        ge=MIN_WINDOW_S,
        description="Stop a job (with a checkpoint) this long after it first started: 72h.",
    )
    data: Data = Field(
        default_factory=Data,
        description="Data gravity: what moving a job's checkpoint to an offer may cost, and "
        "which regions it may go to (applies only to jobs with state).",
        examples=[{"max_move_usd": 1.0, "regions": {"allow": ["eu-*", "europe-*"]}}],
    )
    migration: Migration = Field(
        default_factory=Migration,
        description="Move running jobs through a checkpoint when the market or the policy "
        "changes (off unless enabled).",
        examples=[{"enabled": True, "min_savings": 0.25, "min_stable": "30m"}],
    )
    schedule: Schedule | None = Field(
        None,
        description="Time windows in which markets, bid, placement or rank_by take other "
        "values; outside every window the values above apply.",
        examples=[
            {
                "timezone": "Europe/Berlin",
                "windows": [
                    {
                        "name": "office-hours",
                        "days": ["mon", "tue", "wed", "thu", "fri"],
                        "hours": "09:00-18:00",
                        "markets": ["on_demand"],
                    }
                ],
            }
        ],
    )

    @field_validator("markets")
    @classmethod
    def _unique_markets(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError("markets lists a market twice")
        return value

    def memory_need_gib(self) -> float:
        """Per-GPU memory an offer must have: the need grown by the buffer."""
        return sizing.with_buffer(self.workload.gpu_memory_need_gib(), self.buffer)


def json_schema() -> dict[str, object]:
    """The JSON Schema of a policy file (by alias, as people write it)."""
    schema = Policy.model_json_schema(by_alias=True, mode="validation")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    return schema
