"""AwsProvider: the Provider contract for AWS EC2, plus queue-mode interruption events."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from datetime import UTC, datetime, timedelta
from typing import Any

from optimizer.model import Market, Offer
from providers.aws import commitments as C
from providers.aws import launch as L
from providers.aws import offers as O
from providers.aws import pricing as P
from providers.aws import specs as S
from providers.aws.clients import DEFAULT_REGION, Clients, aws_disabled_reason, new_session
from providers.aws.errors import translate
from providers.aws.instances import InstanceOps
from providers.base import ProviderDisabled, ProviderError, SpecCache

# On-demand list prices change rarely; Karpenter refreshes its copy every 12 h
# (`pkg/controllers/providers/pricing/controller.go`, REFERENCE.md §1.2).
LIST_PRICE_MAX_AGE = timedelta(hours=12)
SCORE_MAX_AGE = timedelta(hours=1)
# Commitment rates change more rarely still: Reserved Instance terms come in the same
# GetProducts elements as the list prices and are saved with them (every 12 h, no call of
# their own); Savings Plans rates are one call chain per type, asked once a day.
COMMITMENT_MAX_AGE = timedelta(hours=24)

Inventory = tuple[dict[str, S.GpuType], dict[str, str]]  # (types by name, zone name → ID)


def _utcnow() -> datetime:
    return datetime.now(UTC)


class AwsProvider(InstanceOps):
    """GPU offers, launches and interruption signals on AWS.

    `fetch_offers` emits, per region: a spot offer per (GPU type, zone ID) with the latest
    spot price, and an on-demand offer per (GPU type, zone ID) where the type is offered,
    priced at the region's list price; with `commitments=True`, also a committed offer per
    (type, region, Reserved Instance or Savings Plans rate) where there is an on-demand one.
    `problems` lists what went wrong in the last poll without stopping it (a region
    unreachable, pricing down, specs served from an old copy).
    """

    name = "aws"

    def __init__(
        self,
        regions: Iterable[str] | None = None,
        *,
        session: Any = None,
        cache: SpecCache | None = None,
        clock: Callable[[], datetime] | None = None,
        max_workers: int = 8,
        pricing_region: str = "us-east-1",
        queue_url: str | None = None,
        placement_scores: bool = False,
        endpoint_url: str | Mapping[str, str] | None = None,
        launch_config: L.AwsLaunchConfig | None = None,
        commitments: bool = False,
    ) -> None:
        self.regions = tuple(regions) if regions else None
        self.cache: SpecCache = cache if cache is not None else S.MemoryCache()
        self.clock = clock or _utcnow
        self.max_workers = max(1, max_workers)
        self.pricing_region = pricing_region
        self.queue_url = queue_url
        self.placement_scores = placement_scores
        self.commitments = commitments
        self.launch_config = launch_config or L.AwsLaunchConfig()
        self.problems: list[str] = []
        self.queue_problems: list[str] = []
        self._session = session
        self._endpoint_url = endpoint_url
        self._clients: Clients | None = None
        self._lock = threading.Lock()
        self._memo: dict[tuple[str, ...], tuple[datetime, Any]] = {}
        self._launched: dict[str, datetime] = {}

    # --- plumbing ---------------------------------------------------------------------------

    @classmethod
    def disabled_reason(cls, session: Any = None) -> str | None:
        """One line when no AWS credentials are found; None when AWS is usable."""
        return aws_disabled_reason(session)

    @property
    def session(self) -> Any:
        with self._lock:
            if self._session is None:
                self._session = new_session()
            return self._session

    def client(self, service: str, region: str) -> Any:
        if self._clients is None:
            clients = Clients(
                self.session,
                endpoint_url=self._endpoint_url,
                max_pool_connections=self.max_workers * 2,
            )
            with self._lock:
                if self._clients is None:
                    self._clients = clients
        assert self._clients is not None
        return self._clients.get(service, region)

    def close(self) -> None:
        """Nothing to release: boto3 clients need no closing."""

    @property
    def home_region(self) -> str:
        return getattr(self.session, "region_name", None) or DEFAULT_REGION

    def _remember(self, key: tuple[str, ...], max_age: timedelta, make: Callable[[], Any]) -> Any:
        now = self.clock()
        with self._lock:
            hit = self._memo.get(key)
        if hit is not None and now - hit[0] < max_age:
            return hit[1]
        value = make()
        with self._lock:
            self._memo[key] = (now, value)
        return value

    def _cached(
        self,
        key: str,
        fetch: Callable[[], Any],
        *,
        max_age: timedelta,
        label: str,
        problems: list[str],
        encode: Callable[[Any], Any] = lambda v: v,
        decode: Callable[[Any], Any] = lambda v: v,
    ) -> Any:
        def on_stale(exc: Exception, fetched_at: datetime) -> None:
            problems.append(
                f"{label} not refreshed ({translate(exc)}); using the copy from "
                f"{fetched_at.isoformat(timespec='minutes')}"
            )

        return S.cached(
            self.cache,
            key,
            now=self.clock(),
            max_age=max_age,
            fetch=fetch,
            encode=encode,
            decode=decode,
            on_stale=on_stale,
        )

    def _inventory(self, region: str, problems: list[str]) -> Inventory:
        ec2 = self.client("ec2", region)
        types = self._cached(
            f"instance-types/{region}",
            lambda: S.list_gpu_types(ec2),
            max_age=S.SPEC_MAX_AGE,
            label=f"{region}: instance types",
            problems=problems,
            encode=S.encode_types,
            decode=S.decode_types,
        )
        zones = self._cached(
            f"zones/{region}",
            lambda: S.zone_ids(ec2),
            max_age=S.SPEC_MAX_AGE,
            label=f"{region}: zone IDs",
            problems=problems,
        )
        return {t.instance_type: t for t in types}, dict(zones)

    def _all_regions(self, problems: list[str]) -> list[str]:
        ec2 = self.client("ec2", self.home_region)

        def fetch() -> list[str]:
            reply = ec2.describe_regions()  # the regions enabled for this account
            return sorted(r["RegionName"] for r in reply.get("Regions", []))

        regions: list[str] = self._cached(
            "regions", fetch, max_age=S.SPEC_MAX_AGE, label="region list", problems=problems
        )
        return regions

    # --- offers -----------------------------------------------------------------------------

    def fetch_offers(self, regions: Sequence[str] | None = None) -> list[Offer]:
        """GPU offers in `regions` (default: the configured ones, else every enabled one)."""
        reason = self.disabled_reason(self.session)
        if reason:
            raise ProviderDisabled(reason, provider=self.name)
        now = self.clock()
        problems: list[str] = []
        try:
            if regions is None:
                regions = self.regions or self._all_regions(problems)
        except Exception as exc:
            raise translate(exc) from exc
        wanted = list(dict.fromkeys(regions))  # an empty list asks for nothing
        failures: dict[str, ProviderError] = {}
        inventories: dict[str, Inventory] = {}
        markets: dict[str, Future[tuple[dict[str, set[str]], dict[O.TypeInZone, float]]]] = {}
        prices: dict[str, Future[dict[str, float]]] = {}
        price_errors: list[str] = []

        with ThreadPoolExecutor(self.max_workers, thread_name_prefix="gpuopt-aws") as pool:
            pending = {pool.submit(self._inventory, r, problems): r for r in wanted}
            for done in as_completed(pending):
                region = pending[done]
                try:
                    inventories[region] = done.result()
                except Exception as exc:
                    failures[region] = translate(exc)
                    continue
                types = inventories[region][0]
                markets[region] = pool.submit(self._market, region, types, now)
                for name, spec in types.items():
                    if spec.sold_on_demand and name not in prices:
                        prices[name] = pool.submit(self._list_prices, name, price_errors)
            scores = self._scores(pool, inventories, problems) if self.placement_scores else {}
            on_demand: dict[str, dict[str, float]] = {}
            for name, future in prices.items():
                for region, usd in future.result().items():
                    on_demand.setdefault(region, {})[name] = usd

            offers: list[Offer] = []
            for region in wanted:
                if region not in markets:
                    continue
                try:
                    offered, spot = markets[region].result()
                except Exception as exc:
                    failures[region] = translate(exc)
                    continue
                types, zones = inventories[region]
                offers.extend(
                    O.build_offers(
                        region, types, zones, offered, spot, on_demand.get(region, {}), scores, now
                    )
                )
            if self.commitments:
                offers.extend(self._committed(pool, offers, problems))

        if price_errors:
            problems.append(
                f"pricing unreachable: {price_errors[0]} ({len(price_errors)} of {len(prices)} "
                "types without a fresh list price)"
            )
        problems.extend(f"{r}: {failures[r]}" for r in wanted if r in failures)
        self.problems = problems
        if wanted and len(failures) == len(wanted):
            raise failures[wanted[0]]
        return offers

    def _market(
        self, region: str, types: Mapping[str, S.GpuType], now: datetime
    ) -> tuple[dict[str, set[str]], dict[O.TypeInZone, float]]:
        """(offered zones per type, latest spot price per pool): two chains per region."""
        ec2 = self.client("ec2", region)
        offered = O.offered_zones(ec2, sorted(types))
        spot_types = sorted(t for t in offered if types[t].sold_spot) if offered else []
        rows = O.spot_history(ec2, spot_types, now) if spot_types else []
        return offered, O.latest_spot_prices(rows)

    def _list_prices(
        self, instance_type: str, errors: list[str], *, refresh: bool = False
    ) -> dict[str, float]:
        """{region: USD/h} for one type, from the cache or one GetProducts chain; the chain's
        Reserved Instance rates are saved beside them (`reserved/<type>`)."""
        key = f"on-demand/{instance_type}"
        hit = self.cache.load_cached(S.PROVIDER, key)
        now = self.clock()
        if not refresh and hit is not None and now - hit[0] < LIST_PRICE_MAX_AGE:
            return dict(hit[1])
        if errors:  # pricing already failed this poll: don't wait on it once per type
            errors.append(errors[0])
            return dict(hit[1]) if hit is not None else {}
        try:
            items = P.price_list(self.client("pricing", self.pricing_region), instance_type)
        except Exception as exc:
            errors.append(str(translate(exc)))
            return dict(hit[1]) if hit is not None else {}
        value = P.on_demand_from(items, instance_type)
        reserved = C.encode_rates(C.reserved_from(items, instance_type))
        self.cache.save_cached(S.PROVIDER, key, value, now)
        self.cache.save_cached(S.PROVIDER, f"reserved/{instance_type}", reserved, now)
        return value

    # --- commitments --------------------------------------------------------------------------

    def _committed(
        self, pool: ThreadPoolExecutor, offers: Sequence[Offer], problems: list[str]
    ) -> list[Offer]:
        """Committed offers for the types with an on-demand offer (which gives their specs)."""
        names = sorted({o.instance_type for o in offers if o.market is Market.ON_DEMAND})
        reserved_errors: list[str] = []
        plan_errors: list[str] = []
        futures = [
            pool.submit(self._commitment_rates, name, reserved_errors, plan_errors)
            for name in names
        ]
        rates = [rate for future in futures for rate in future.result()]
        for what, errors in (
            ("reserved instance rates", reserved_errors),
            ("savings plans rates", plan_errors),
        ):
            if errors:
                problems.append(
                    f"{what} unavailable: {errors[0]} ({len(errors)} of {len(names)} types "
                    "without fresh rates)"
                )
        return C.committed_offers(offers, rates)

    def _commitment_rates(
        self, instance_type: str, reserved_errors: list[str], plan_errors: list[str]
    ) -> list[C.Rate]:
        """One type's Reserved Instance and Savings Plans rates, every region."""
        key = f"reserved/{instance_type}"
        hit = self.cache.load_cached(S.PROVIDER, key)
        if hit is None or self.clock() - hit[0] >= COMMITMENT_MAX_AGE:
            # Not saved with a list price yet (or long ago): read the chain again.
            self._list_prices(instance_type, reserved_errors, refresh=True)
            hit = self.cache.load_cached(S.PROVIDER, key)
        reserved = C.decode_rates(hit[1]) if hit is not None else []
        return reserved + self._savings_plans(instance_type, plan_errors)

    def _savings_plans(self, instance_type: str, errors: list[str]) -> list[C.Rate]:
        key = f"savings-plans/{instance_type}"
        hit = self.cache.load_cached(S.PROVIDER, key)
        now = self.clock()
        stale = C.decode_rates(hit[1]) if hit is not None else []
        if hit is not None and now - hit[0] < COMMITMENT_MAX_AGE:
            return stale
        if errors:  # the API already failed this poll: the cached copy, no more waiting
            errors.append(errors[0])
            return stale
        try:
            client = self.client("savingsplans", C.SAVINGS_PLANS_REGION)
            rates = C.savings_plan_rates(client, instance_type)
        except Exception as exc:
            errors.append(str(translate(exc)))
            return stale
        self.cache.save_cached(S.PROVIDER, key, C.encode_rates(rates), now)
        return rates

    def _scores(
        self, pool: ThreadPoolExecutor, inventories: Mapping[str, Inventory], problems: list[str]
    ) -> dict[tuple[str, str], float]:
        """{(zone ID, type): placement score}; a failure here never blocks prices."""
        regions = sorted(inventories)
        spot_types = {
            n: t for types, _ in inventories.values() for n, t in types.items() if t.sold_spot
        }
        ec2 = self.client("ec2", regions[0] if regions else self.home_region)
        groups = O.score_groups(spot_types.values())
        futures = {
            group: pool.submit(
                self._remember,
                ("scores", *group, "@", *regions),
                SCORE_MAX_AGE,
                functools.partial(O.placement_scores, ec2, group, regions),
            )
            for group in groups
        }
        out: dict[tuple[str, str], float] = {}
        errors: list[ProviderError] = []
        for group, future in futures.items():
            try:
                by_zone = future.result()
            except Exception as exc:
                errors.append(translate(exc))
                continue
            for zone, score in by_zone.items():
                out.update({(zone, name): score for name in group})
        if errors:
            problems.append(f"placement scores unavailable: {errors[0]}")
        return out
