"""Cost lines of a job's state: its checkpoints at rest, and the data its restores moved (pure).

- Storage: each checkpoint is kept from `committed_at` to `deleted_at` (or `until`, while it
  is kept), at its store's Standard-class rate (`policies.egress.storage_rate`):
  GB-months = size_bytes / 1e9 x seconds kept / (730 h x 3600 s), split by calendar month
  (UTC) like every other line. FOCUS ServiceCategory "Storage".
- Egress: each restore moved `fetched_bytes` (what it downloaded: files whose sha256 already
  matched a local copy cross no network) from where the checkpoint is to where the attempt
  runs, at the source cloud's rate for that path (`transfer_usd_per_gb`). FOCUS
  ServiceCategory "Networking". A restore in the checkpoint's own region costs nothing and
  gets no line.

The inputs are any objects with the fields of the store's checkpoint and restore records
(`CheckpointLike`, `RestoreLike`): the functions read nothing else, so tests hand them small
dataclasses and the daemon hands them its rows (`state_lines`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Protocol

from optimizer.costs.ledger import Cost, clip, month_windows
from optimizer.costs.lines import CHECKPOINT_STORAGE, EGRESS, Line
from policies.egress import (
    GB,
    HOURS_PER_MONTH,
    SAME_REGION,
    storage_rate,
    transfer_usd_per_gb,
)

Time = datetime | float  # a datetime, or epoch seconds
JobNames = Mapping[int, tuple[str, str]]  # job id -> (job name, policy name)
SECONDS_PER_MONTH = HOURS_PER_MONTH * 3600


class CheckpointLike(Protocol):
    """The fields of a stored checkpoint (CheckpointRecord) a storage line reads."""

    @property
    def job_id(self) -> int: ...
    @property
    def attempt_id(self) -> int | None: ...
    @property
    def name(self) -> str: ...
    @property
    def size_bytes(self) -> int: ...
    @property
    def uri(self) -> str: ...
    @property
    def provider(self) -> str | None: ...
    @property
    def region(self) -> str | None: ...
    @property
    def committed_at(self) -> Time: ...
    @property
    def deleted_at(self) -> Time | None: ...


class RestoreLike(Protocol):
    """The fields of a stored restore (RestoreRecord) an egress line reads."""

    @property
    def job_id(self) -> int: ...
    @property
    def attempt_id(self) -> int | None: ...
    @property
    def checkpoint_name(self) -> str: ...
    @property
    def fetched_bytes(self) -> int: ...
    @property
    def from_provider(self) -> str | None: ...
    @property
    def from_region(self) -> str | None: ...
    @property
    def to_provider(self) -> str | None: ...
    @property
    def to_region(self) -> str | None: ...
    @property
    def at(self) -> Time: ...


def _at(value: Time) -> datetime:
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError(f"{value!r} is a naive time: state lines need UTC times")
        return value.astimezone(UTC)
    return datetime.fromtimestamp(float(value), UTC)


def _names(jobs: JobNames | None, job_id: int) -> tuple[str, str]:
    found = (jobs or {}).get(job_id)
    return found if found is not None else (f"job-{job_id}", "")


def gb_months(size_bytes: float, seconds: float) -> float:
    """GB-months of `size_bytes` kept `seconds` (a month being 730 hours)."""
    return size_bytes / GB * max(seconds, 0.0) / SECONDS_PER_MONTH


def storage_lines(
    checkpoints: Iterable[CheckpointLike],
    *,
    until: datetime,
    jobs: JobNames | None = None,
    since: datetime | None = None,
) -> list[Line]:
    """One Storage line per checkpoint and calendar month it was kept in, within [since,
    until): from its commit to its deletion, or to `until` while it is kept. A checkpoint
    whose provider is unknown gets no line (nothing to price it by)."""
    until = _at(until)
    out: list[Line] = []
    for c in checkpoints:
        if not c.provider:
            continue
        start = _at(c.committed_at)
        end = min(_at(c.deleted_at), until) if c.deleted_at is not None else until
        if since is not None:
            start = max(start, _at(since))
        if end <= start:
            continue
        rate = storage_rate(c.provider, c.region)
        job, policy = _names(jobs, c.job_id)
        for month in month_windows(start, end):
            part = clip((start, end), month)
            if part is None:
                continue
            quantity = gb_months(c.size_bytes, (part[1] - part[0]).total_seconds())
            out.append(
                Line(
                    job_id=c.job_id,
                    job=job,
                    policy=policy,
                    attempt=0,
                    provider=c.provider,
                    region=c.region or "",
                    zone=None,
                    instance_type="",
                    market=CHECKPOINT_STORAGE,
                    instance_id=None,
                    launched=part[0],
                    ended=part[1] if c.deleted_at is not None and part[1] >= end else None,
                    period_start=month[0],
                    period_end=month[1],
                    cost=Cost(
                        billed_seconds=(part[1] - part[0]).total_seconds(),
                        storage_usd=quantity * rate.usd_per_gb_month,
                    ),
                    kind=CHECKPOINT_STORAGE,
                    quantity=quantity,
                    resource=f"{c.uri.rstrip('/')}/{c.name}" if c.uri else c.name,
                )
            )
    return out


def egress_lines(restores: Iterable[RestoreLike], *, jobs: JobNames | None = None) -> list[Line]:
    """One Networking line per restore that moved data between regions or clouds: its
    fetched bytes at the source cloud's rate for the path (module docstring)."""
    out: list[Line] = []
    for r in restores:
        if not (r.from_provider and r.from_region and r.to_provider and r.to_region):
            continue
        rate = transfer_usd_per_gb(r.from_provider, r.from_region, r.to_provider, r.to_region)
        if rate.path == SAME_REGION or r.fetched_bytes <= 0:
            continue
        at = _at(r.at)
        month = _month_of(at)
        quantity = r.fetched_bytes / GB
        job, policy = _names(jobs, r.job_id)
        out.append(
            Line(
                job_id=r.job_id,
                job=job,
                policy=policy,
                attempt=0,
                provider=r.from_provider,
                region=r.from_region,
                zone=None,
                instance_type="",
                market=EGRESS,
                instance_id=None,
                launched=at,
                ended=at,
                period_start=month[0],
                period_end=month[1],
                cost=Cost(network_usd=quantity * rate.usd_per_gb),
                kind=EGRESS,
                quantity=quantity,
                resource=(
                    f"{r.checkpoint_name}: {r.from_provider} {r.from_region} -> "
                    f"{r.to_provider} {r.to_region} ({rate.path})"
                ),
            )
        )
    return out


def _month_of(at: datetime) -> tuple[datetime, datetime]:
    start = datetime(at.year, at.month, 1, tzinfo=UTC)
    following = datetime(at.year + (at.month == 12), at.month % 12 + 1, 1, tzinfo=UTC)
    return start, following


def state_lines(
    checkpoints: Iterable[CheckpointLike],
    restores: Iterable[RestoreLike],
    *,
    until: datetime,
    jobs: JobNames | None = None,
    keep: Callable[[Line], bool] | None = None,
) -> list[Line]:
    """Every line of the jobs' state, storage then egress: the one function the cost
    surfaces (`gpuopt costs`, the FOCUS export, budgets) call with the store's rows; `keep`
    filters the lines (a window, a job, a policy)."""
    lines = [
        *storage_lines(checkpoints, until=until, jobs=jobs),
        *egress_lines(restores, jobs=jobs),
    ]
    return [line for line in lines if keep is None or keep(line)]
