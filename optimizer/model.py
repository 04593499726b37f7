"""The domain values every layer shares: markets, interconnects, the immutable Offer and the
kinds of event the daemon records."""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from itertools import count
from operator import attrgetter
from typing import Any, NamedTuple

from optimizer.clock import parse_utc, utc_text


class Market(StrEnum):
    """How an instance is bought."""

    SPOT = "spot"
    ON_DEMAND = "on_demand"
    # A 1- or 3-year commitment (AWS Reserved Instance or Savings Plan rate, GCP committed use
    # discount): paid for every hour of its term whatever the usage; `usd_per_hour` is the
    # effective rate (upfront spread over the term's hours plus the hourly fee).
    COMMITTED = "committed"
    # A machine the team owns (providers/ssh), priced at its TCO rate per GPU-hour.
    OWNED = "owned"


class PaymentOption(StrEnum):
    """How a commitment is paid (AWS's three purchase options; GCP CUDs are billed monthly,
    which is `no_upfront`)."""

    NO_UPFRONT = "no_upfront"
    PARTIAL_UPFRONT = "partial_upfront"
    ALL_UPFRONT = "all_upfront"


# Hours in a commitment year: 365 x 24. Effective rates divide the upfront fee by these hours;
# AWS states no convention for it (REFERENCE-ROUND2 section 3a), and 8,760 is the usual one.
HOURS_PER_YEAR = 8760


class Interconnect(StrEnum):
    """The GPU-to-GPU link inside one instance."""

    NONE = "none"  # a single GPU, nothing to connect
    PCIE = "pcie"  # GPUs talk through the PCIe host bridge only
    NVLINK = "nvlink"  # NVLink bridges or an NVSwitch fabric
    INFINITY_FABRIC = "infinity_fabric"  # AMD's GPU-to-GPU link


class Fabric(StrEnum):
    """The network between instances that multi-node work runs over (docs/policies.md#multi-node).

    What AWS and GCP sell for GPU-to-GPU traffic across machines: AWS's Elastic Fabric
    Adapter, and GCP's GPUDirect generations (TCPX on A3 High/Edge, TCPXO on A3 Mega, RDMA over
    RoCE on A3 Ultra, A4 and A4X). `none` is the ordinary VPC network.
    """

    NONE = "none"
    EFA = "efa"
    GPUDIRECT_TCPX = "gpudirect_tcpx"
    GPUDIRECT_TCPXO = "gpudirect_tcpxo"
    GPUDIRECT_RDMA = "gpudirect_rdma"


class Pool(NamedTuple):
    """A capacity pool: one instance type bought one way in one region or zone.

    A tuple (it unpacks, compares and hashes as one), with one text form, `str(pool)`:
    `provider/region/zone/type/market`, `-` for no zone, the form events' data and the
    daemon's price state carry; `Pool.parse` reads it back. `label` is how messages word it.
    """

    provider: str
    region: str
    zone: str | None
    instance_type: str
    market: str

    def __str__(self) -> str:
        return "/".join(
            (self.provider, self.region, self.zone or "-", self.instance_type, self.market)
        )

    @property
    def label(self) -> str:
        """The pool in a sentence: `aws eu-west-1/euw1-az1 p4d.24xlarge spot`."""
        zone = f"/{self.zone}" if self.zone else ""
        return f"{self.provider} {self.region}{zone} {self.instance_type} {self.market}"

    @classmethod
    def parse(cls, text: str) -> Pool:
        """The pool `str(pool)` wrote; a ValueError names what is wrong with other text."""
        parts = text.split("/")
        if len(parts) != 5 or not all(parts):
            raise ValueError(
                f"not a pool: {text!r} (expected provider/region/zone/type/market, - for no zone)"
            )
        provider, region, zone, instance_type, market = parts
        return cls(provider, region, None if zone == "-" else zone, instance_type, market)


class OfferError(ValueError):
    """An Offer field holds a value that cannot be right."""


def _utc(value: datetime) -> datetime:
    if value.tzinfo is None:
        raise OfferError("observed_at must be timezone-aware (UTC)")
    return value.astimezone(UTC)


# Offer fields that give a row its shape: what the offer-independent rules of the ranking
# engine read (policies/table.py), and what an offer's shape number stands for.
SHAPE_FIELDS = (
    "market",
    "provider",
    "region",
    "instance_type",
    "gpu_model",
    "gpu_count",
    "gpu_memory_gib",
    "interconnect",
    "vcpus",
    "ram_gib",
    "fabric",
)
_shape_of = attrgetter(*SHAPE_FIELDS)

# Each distinct shape's number. Numbers come from one counter and are never handed out
# twice, so offers with the same number have the same shape; offers with the same shape share
# a number unless the map was emptied between them (it is when it grows past _SHAPES_KEPT,
# so a long life of changing catalogs cannot grow it for good): a reader groups the numbers'
# shapes by value to be exact (policies/table.py does). `next` on a counter is one step under
# the interpreter's lock, so two threads never get the same number.
_SHAPES: dict[tuple[Any, ...], int] = {}
_SHAPES_KEPT = 1 << 16
_next_shape = count().__next__

# An offer's row as the ranking table reads it, packed once when the offer is made: its
# shape number, its observation time in whole microseconds since the epoch (equal times,
# equal numbers) and its price. A table of 100k offers then reads these three columns with
# one join of bytes, not three passes of attribute reads (bench/ranking.py).
ROW_FORMAT = struct.Struct("<qqd")
ROW_FIELDS = ("shape", "observed_us", "usd_per_hour")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def _shape_number(shape: tuple[Any, ...]) -> int:
    number = _SHAPES.get(shape)
    if number is None:
        if len(_SHAPES) >= _SHAPES_KEPT:
            _SHAPES.clear()
        number = _SHAPES.setdefault(shape, _next_shape())
    return number


class _Packed:
    """The one slot an Offer has besides its fields: its packed row (`ROW_FORMAT`)."""

    __slots__ = ("_row",)
    _row: bytes


def packed_rows(offers: Iterable[Offer]) -> bytes:
    """The offers' packed rows (`ROW_FORMAT`), one after the other (a list for the join:
    faster than a generator or a map of an attrgetter, which it would make a list of)."""
    return b"".join([offer._row for offer in offers])


@dataclass(frozen=True, slots=True)
class Offer(_Packed):
    """One purchasable instance type in one place and market, priced at one moment.

    `zone` is None where the cloud prices per region (on-demand, GCP spot). GPU memory
    is per GPU. `source` says where the price came from (e.g. `aws-api`, `snapshot`,
    `simulated`) so a simulated price is never mistaken for a quoted one.

    A `committed` offer also has its term (`term_years`), `payment_option` and the
    `upfront_usd` paid at the start of each term for one instance; its `usd_per_hour` is the
    effective hourly price, upfront included (`recurring_usd_per_hour` is the hourly fee
    alone). Offers of the other markets leave the three empty.
    """

    provider: str
    region: str
    zone: str | None
    instance_type: str
    gpu_model: str
    gpu_count: int
    gpu_memory_gib: float
    vcpus: int
    ram_gib: float
    interconnect: Interconnect
    market: Market
    usd_per_hour: float
    observed_at: datetime
    placement_score: float | None = None
    interruption_bucket: str | None = None
    source: str = field(default="")
    # The inter-node fabric of the type and how many of its interfaces an instance can carry
    # (AWS: EFA interfaces; GCP: GPU data NICs); hardware.instance_fabric has the sources.
    fabric: Fabric = Fabric.NONE
    fabric_interfaces: int = 0
    term_years: int | None = None
    payment_option: PaymentOption | None = None
    upfront_usd: float | None = None

    def __post_init__(self) -> None:
        # Coerce the enums and times so rows read from text compare equal to built ones.
        object.__setattr__(self, "market", Market(self.market))
        object.__setattr__(self, "interconnect", Interconnect(self.interconnect))
        object.__setattr__(self, "fabric", Fabric(self.fabric))
        object.__setattr__(self, "observed_at", _utc(self.observed_at))
        for name in ("provider", "region", "instance_type", "gpu_model"):
            if not getattr(self, name):
                raise OfferError(f"{name} must not be empty")
        if self.zone == "":
            object.__setattr__(self, "zone", None)
        if self.gpu_count < 0:
            raise OfferError(f"gpu_count must be >= 0, got {self.gpu_count}")
        if self.vcpus < 0:
            raise OfferError(f"vcpus must be >= 0, got {self.vcpus}")
        for name in ("gpu_memory_gib", "ram_gib", "usd_per_hour"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise OfferError(f"{name} must be a finite number >= 0, got {value}")
        if self.fabric_interfaces < 0:
            raise OfferError(f"fabric_interfaces must be >= 0, got {self.fabric_interfaces}")
        if self.placement_score is not None and not 0 <= self.placement_score <= 10:
            raise OfferError(f"placement_score must be within 0..10, got {self.placement_score}")
        self._check_commitment()
        micros = (self.observed_at - _EPOCH) // _MICROSECOND
        row = ROW_FORMAT.pack(_shape_number(_shape_of(self)), micros, self.usd_per_hour)
        object.__setattr__(self, "_row", row)

    def __reduce__(self) -> tuple[Any, ...]:
        # Made again through __init__ (a copy or an unpickled offer gets its packed row).
        return (type(self), tuple(getattr(self, name) for name in OFFER_FIELDS))

    def _check_commitment(self) -> None:
        terms = (self.term_years, self.payment_option, self.upfront_usd)
        if self.market is not Market.COMMITTED:
            if any(value is not None for value in terms):
                raise OfferError(
                    "term_years (like payment_option and upfront_usd) is for committed offers "
                    f"only, not {self.market.value}"
                )
            return
        if self.term_years is None or self.term_years < 1:
            raise OfferError(
                f"term_years must be >= 1 for a committed offer, got {self.term_years}"
            )
        if self.payment_option is None:
            raise OfferError("payment_option must be given for a committed offer")
        object.__setattr__(self, "payment_option", PaymentOption(self.payment_option))
        if self.upfront_usd is None:
            object.__setattr__(self, "upfront_usd", 0.0)
        upfront = self.upfront_usd
        if upfront is None or not math.isfinite(upfront) or upfront < 0:
            raise OfferError(f"upfront_usd must be a finite number >= 0, got {upfront}")
        if upfront > self.usd_per_hour * self.term_hours * (1 + 1e-9) + 1e-6:
            raise OfferError(
                f"upfront_usd {upfront} is more than the effective price over the term "
                f"({self.usd_per_hour} x {self.term_hours} h)"
            )

    @property
    def term_hours(self) -> int:
        """Hours in a committed offer's term (0 for the other markets)."""
        return (self.term_years or 0) * HOURS_PER_YEAR

    @property
    def recurring_usd_per_hour(self) -> float:
        """The hourly fee alone: the effective price less the upfront spread over the term."""
        if self.market is not Market.COMMITTED:
            return self.usd_per_hour
        return max(0.0, self.usd_per_hour - (self.upfront_usd or 0.0) / self.term_hours)

    @property
    def pool(self) -> Pool:
        """The capacity pool this offer prices."""
        return Pool(self.provider, self.region, self.zone, self.instance_type, self.market)

    @property
    def total_gpu_memory_gib(self) -> float:
        return self.gpu_memory_gib * self.gpu_count

    @property
    def usd_per_gpu_hour(self) -> float:
        return self.usd_per_hour / self.gpu_count if self.gpu_count else math.inf

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready values, in field order."""
        out = asdict(self)
        out["market"] = self.market.value
        out["interconnect"] = self.interconnect.value
        out["fabric"] = self.fabric.value
        out["observed_at"] = utc_text(self.observed_at)
        if self.payment_option is not None:
            out["payment_option"] = self.payment_option.value
        return out

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> Offer:
        """The offer `to_dict` wrote (an API answer's offer, say); OfferError if it is not one."""
        try:
            fields = {name: values[name] for name in cls.__dataclass_fields__ if name in values}
            fields["observed_at"] = parse_utc(str(fields["observed_at"]))
            return cls(**fields)
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, OfferError):
                raise
            raise OfferError(f"not an offer: {exc.__class__.__name__}: {exc}") from None


OFFER_FIELDS: tuple[str, ...] = tuple(Offer.__dataclass_fields__)


class EventKind(StrEnum):
    """Every kind of event the daemon records, spelled `noun.verb` (what happened to what).

    The one list: emitters take these members, never strings, and docs/alerts.md lists each
    kind with its severity and its `data` fields (a test holds the two together).
    """

    # Price signals, per policy, after each poll
    BEST_OFFER_CHANGED = "best_offer.changed"
    BEST_OFFER_LOST = "best_offer.lost"
    PRICE_DROPPED = "price.dropped"
    BID_CAP_CROSSED = "bid_cap.crossed"
    # The policy directory
    POLICY_LOADED = "policy.loaded"
    POLICY_REJECTED = "policy.rejected"
    POLICY_REMOVED = "policy.removed"
    POLICY_KEPT = "policy.kept"
    POLICY_WINDOW_CHANGED = "policy.window_changed"
    POLICY_SKIPPED = "policy.skipped"
    # Price polling and providers
    POLL_FAILED = "poll.failed"
    POLL_RECOVERED = "poll.recovered"
    PROVIDER_DISABLED = "provider.disabled"
    PROVIDER_QUOTA_EXCEEDED = "provider.quota_exceeded"
    PROVIDER_AUTH_FAILED = "provider.auth_failed"
    # Jobs
    JOB_SUBMITTED = "job.submitted"
    JOB_CANCELLED = "job.cancelled"
    JOB_REMOVED = "job.removed"
    JOB_STATE_CHANGED = "job.state_changed"
    JOB_DEFERRED = "job.deferred"
    JOB_POLICY_MISSING = "job.policy_missing"
    JOB_LAUNCH_FAILED = "job.launch_failed"
    JOB_LAUNCH_TIMED_OUT = "job.launch_timed_out"
    JOB_INTERRUPTED = "job.interrupted"
    JOB_PROBE_FAILED = "job.probe_failed"
    JOB_INSTANCE_LOST = "job.instance_lost"
    JOB_INSTANCE_LEFT_TO_CLOUD = "job.instance_left_to_cloud"
    JOB_FENCE_LIFTED = "job.fence_lifted"
    JOB_SUCCEEDED = "job.succeeded"
    JOB_FAILED = "job.failed"
    JOB_UNDERUSED = "job.underused"
    JOB_STOPPED = "job.stopped"
    JOB_MIGRATED = "job.migrated"
    JOB_SPARE_CHANGED = "job.spare_changed"
    JOB_DEADLINE_AT_RISK = "job.deadline_at_risk"
    JOB_DEADLINE_MISSED = "job.deadline_missed"
    BUDGET_THRESHOLD_CROSSED = "budget.threshold_crossed"
    JOB_WARNING = "job.warning"
    # Checkpoints in object storage (the agents' reports)
    CHECKPOINT_COMMITTED = "checkpoint.committed"
    CHECKPOINT_RESTORED = "checkpoint.restored"
    CHECKPOINT_FAILED = "checkpoint.failed"
    # Probe results
    INSTANCE_TYPE_DEMOTED = "instance_type.demoted"
    # The cost ledger
    COSTS_MONTHLY_SUMMARY = "costs.monthly_summary"
    # Replicas
    LEADER_ELECTED = "leader.elected"


LEGACY_EVENT_KINDS: Mapping[str, EventKind] = {
    # Earlier spellings: stored events were renamed by a migration; alert routes that name
    # them (globs included) still match, and `GET /events?kind=` still finds them.
    "best_offer_changed": EventKind.BEST_OFFER_CHANGED,
    "no_candidates": EventKind.BEST_OFFER_LOST,
    "price_drop": EventKind.PRICE_DROPPED,
    "bid_cap_crossed": EventKind.BID_CAP_CROSSED,
    "policy_loaded": EventKind.POLICY_LOADED,
    "policy_invalid": EventKind.POLICY_REJECTED,
    "policy_removed": EventKind.POLICY_REMOVED,
    "policy_deleted_in_use": EventKind.POLICY_KEPT,
    "poll_failed": EventKind.POLL_FAILED,
    "poll_recovered": EventKind.POLL_RECOVERED,
    "provider_disabled": EventKind.PROVIDER_DISABLED,
    "provider.quota": EventKind.PROVIDER_QUOTA_EXCEEDED,
    "provider.auth": EventKind.PROVIDER_AUTH_FAILED,
    "job_submitted": EventKind.JOB_SUBMITTED,
    "job_cancelled": EventKind.JOB_CANCELLED,
    "job.state": EventKind.JOB_STATE_CHANGED,
    "job.pending": EventKind.JOB_DEFERRED,
    "job.no_policy": EventKind.JOB_POLICY_MISSING,
    "job.launch_timeout": EventKind.JOB_LAUNCH_TIMED_OUT,
    "budget.warning": EventKind.BUDGET_THRESHOLD_CROSSED,
    "daemon.leader": EventKind.LEADER_ELECTED,
}


def event_kind(name: str) -> str:
    """A kind as spelled today: an earlier spelling becomes its kind, other names pass."""
    legacy = LEGACY_EVENT_KINDS.get(name)
    return legacy.value if legacy is not None else name


def legacy_names(kind: str) -> tuple[str, ...]:
    """The earlier spellings of a kind (none for a kind that never had another)."""
    return tuple(old for old, new in LEGACY_EVENT_KINDS.items() if new == kind)
