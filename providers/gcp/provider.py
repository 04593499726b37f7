"""GcpProvider: offers from the Compute API and the Cloud Billing Catalog, Spot VM launches.

One refresh = the SKU list (once, for every region) plus, at most once a day, the aggregated
accelerator-type and machine-type lists; the three run concurrently. Machine and accelerator
specs are kept in the SpecCache the caller passes (the store's prices repository), and in
memory.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

from optimizer.model import Market, Offer
from providers.base import (
    InstanceRef,
    InstanceStatus,
    LaunchSpec,
    PriceTooLowError,
    ProviderDisabled,
    ProviderError,
    SpecCache,
)
from providers.gcp import launch as gce
from providers.gcp.billing import (
    COMPUTE_SERVICE,
    SKU_PAGE_SIZE,
    SkuRecord,
    build_commitment_books,
    build_price_book,
)
from providers.gcp.clients import Clients, options_from_settings
from providers.gcp.errors import (
    classify,
    exception_facts,
    from_exception,
    is_already_exists,
    is_in_use,
    operation_facts,
    translated,
)
from providers.gcp.names import basename, instance_name, parse_instance_type, request_id
from providers.gcp.offers import (
    ZoneSpecs,
    build_committed_offers,
    build_offers,
    read_accelerators,
    read_machines,
)
from providers.gcp.settings import EndpointError, GcpSettings, gcp_disabled_reason

PROVIDER = "gcp"
SPECS_KEY = "zone-specs"
SPECS_MAX_AGE = timedelta(hours=24)
# Machine types worth listing: GPU families and the n1 hosts GPUs attach to. The Compute list
# filter takes an RE2 regular expression with `eq` (API reference, `filter` parameter).
MACHINE_FILTER = 'name eq "(n1|a2|a3|a4|a4x|g2|g4)-.*"'
PAGE_SIZE = 500  # the Compute API's largest maxResults
# `zoneOperations.wait` returns when the operation is done or after about two minutes
# (Compute API reference), so a handful of calls covers any launch timeout we allow.
MAX_WAITS = 10


def _utc_now() -> datetime:
    return datetime.now(UTC)


class GcpProvider:
    """The GCP adapter: see docs/providers-gcp.md for configuration."""

    name = PROVIDER

    def __init__(
        self,
        project: str,
        regions: Sequence[str] | None = None,
        *,
        credentials: Any = None,
        client_options: Any = None,
        billing_client_options: Any = None,
        transport: str | None = None,
        cache: SpecCache | None = None,
        clock: Callable[[], datetime] | None = None,
        max_workers: int = 8,
        image: str = gce.DEFAULT_IMAGE,
        network: str = gce.DEFAULT_NETWORK,
        keep_spot_above_on_demand: bool = False,
        launch_timeout_s: float = 120.0,
        settings: GcpSettings | None = None,
        commitments: bool = False,
    ) -> None:
        """`client_options` (dict or ClientOptions) point the Compute clients elsewhere, and the
        Billing client too unless `billing_client_options` is given. Left out, endpoints come
        from `settings` (default: the `GPUOPT_GCP_*` environment), else Google's defaults.
        With `commitments`, `fetch_offers` also returns the committed offers the catalog's
        commitment SKUs price (docs/providers-gcp.md, "Commitments")."""
        if not project:
            raise ProviderDisabled("no GCP project: set GPUOPT_GCP_PROJECT", provider=PROVIDER)
        env_compute, env_billing = options_from_settings(settings or GcpSettings.from_env())
        compute = client_options if client_options is not None else env_compute
        billing = billing_client_options
        if billing is None:
            billing = client_options if client_options is not None else env_billing
        try:
            self._clients = Clients(
                credentials=credentials,
                compute_options=compute or None,
                billing_options=billing or None,
                transport=transport,
            )
        except EndpointError as exc:
            raise ProviderDisabled(str(exc), provider=PROVIDER) from exc
        self.project = project
        self.regions = list(regions) if regions is not None else None
        self.problems: list[str] = []
        self._cache = cache
        self._clock = clock or _utc_now
        self._max_workers = max(1, max_workers)
        self._image = image
        self._network = network
        self._keep_inverted = keep_spot_above_on_demand
        self.commitments = commitments
        self._launch_timeout = timedelta(seconds=launch_timeout_s)
        self._specs: tuple[datetime, ZoneSpecs] | None = None
        self._specs_lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: GcpSettings, **kwargs: Any) -> GcpProvider:
        """A provider for configured settings (project, regions, endpoints, billing API key)."""
        return cls(settings.project or "", settings.regions, settings=settings, **kwargs)

    # --- offers ---------------------------------------------------------------------------------

    def fetch_offers(self, regions: Sequence[str] | None = None) -> list[Offer]:
        """On-demand and Spot offers per zone, priced per region from the billing catalog;
        with `commitments`, 1- and 3-year committed offers per region from the same SKUs."""
        wanted = list(regions) if regions is not None else self.regions
        now = self._clock()
        problems: list[str] = []
        cached = self._cached_specs(now)
        stale = cached is None or now - cached[0] >= SPECS_MAX_AGE
        with ThreadPoolExecutor(max_workers=min(3, self._max_workers)) as pool:
            listed = pool.submit(self._skus)
            accs: Future[Any] | None = None
            machines: Future[Any] | None = None
            if stale:
                accs = pool.submit(self._list_accelerators)
                machines = pool.submit(self._list_machines)
            specs = self._settle_specs(now, cached, accs, machines, problems)
            skus = listed.result()
        book = build_price_book(skus)
        built = build_offers(
            specs,
            book,
            observed_at=now,
            regions=wanted,
            keep_spot_above_on_demand=self._keep_inverted,
        )
        problems += [*book.problems, *built.problems]
        offers = built.offers
        if self.commitments:
            # The commitment SKUs come in the same list: no call of their own.
            books = build_commitment_books(skus)
            committed = build_committed_offers(specs, books, observed_at=now, regions=wanted)
            read = dict.fromkeys(p for b in books.values() for p in b.problems)  # once each
            problems += [*read, *committed.problems]
            offers = [*offers, *committed.offers]
        self.problems = problems
        return offers

    def _settle_specs(
        self,
        now: datetime,
        cached: tuple[datetime, ZoneSpecs] | None,
        accs: Future[Any] | None,
        machines: Future[Any] | None,
        problems: list[str],
    ) -> ZoneSpecs:
        if accs is None or machines is None:
            assert cached is not None
            return cached[1]
        try:
            fresh = ZoneSpecs(accs.result(), machines.result())
        except ProviderError as exc:
            if cached is None:
                raise
            problems.append(
                f"machine/accelerator types not refreshed ({exc}); using the list from "
                f"{cached[0].isoformat()}"
            )
            return cached[1]
        self._store_specs(now, fresh)
        return fresh

    def _cached_specs(self, now: datetime) -> tuple[datetime, ZoneSpecs] | None:
        """The newest specs known: in memory, or in the SpecCache (another replica's refresh)."""
        with self._specs_lock:
            held = self._specs
        if (held is not None and now - held[0] < SPECS_MAX_AGE) or self._cache is None:
            return held
        loaded = self._cache.load_cached(PROVIDER, SPECS_KEY)
        specs = ZoneSpecs.from_json(loaded[1]) if loaded else None
        if loaded is None or specs is None or (held is not None and loaded[0] <= held[0]):
            return held
        with self._specs_lock:
            self._specs = (loaded[0], specs)
        return self._specs

    def _store_specs(self, now: datetime, specs: ZoneSpecs) -> None:
        with self._specs_lock:
            self._specs = (now, specs)
        if self._cache is not None:
            self._cache.save_cached(PROVIDER, SPECS_KEY, specs.to_json(), now)

    def _list_accelerators(self) -> dict[str, Any]:
        from google.cloud import compute_v1

        request = compute_v1.AggregatedListAcceleratorTypesRequest(
            project=self.project, max_results=PAGE_SIZE
        )
        with translated():
            return read_accelerators(
                self._clients.accelerator_types.aggregated_list(request=request)
            )

    def _list_machines(self) -> dict[str, Any]:
        from google.cloud import compute_v1

        request = compute_v1.AggregatedListMachineTypesRequest(
            project=self.project, max_results=PAGE_SIZE, filter=MACHINE_FILTER
        )
        with translated():
            return read_machines(self._clients.machine_types.aggregated_list(request=request))

    def _skus(self) -> list[SkuRecord]:
        """Every Compute Engine SKU, page by page (on-demand, Spot and commitments alike)."""
        request = {"parent": COMPUTE_SERVICE, "page_size": SKU_PAGE_SIZE, "currency_code": "USD"}
        with translated():
            return [SkuRecord.from_message(s) for s in self._clients.catalog.list_skus(request)]

    # --- launch, describe, terminate --------------------------------------------------------

    def launch(self, offer: Offer, spec: LaunchSpec, idempotency_key: str) -> InstanceRef:
        """Insert the attempt's VM; the same key always names the same VM and request id."""
        from google.cloud import compute_v1

        if offer.provider != PROVIDER or not offer.zone:
            raise ProviderError(f"not a zonal GCP offer: {tuple(offer.pool)}", provider=PROVIDER)
        zone = offer.zone
        if spec.max_usd_per_hour is not None and offer.usd_per_hour > spec.max_usd_per_hour:
            # GCP has no cloud-side bid cap; the cap is checked against the quoted price.
            raise PriceTooLowError(
                f"{offer.instance_type} in {zone} costs ${offer.usd_per_hour:.4f}/h, above the "
                f"cap ${spec.max_usd_per_hour:.4f}/h",
                provider=PROVIDER,
                zone=zone,
            )
        try:
            kind = parse_instance_type(offer.instance_type)
        except ValueError as exc:
            raise ProviderError(str(exc), provider=PROVIDER, zone=zone) from exc
        name = instance_name(spec.job, spec.attempt, idempotency_key)
        ref = InstanceRef(PROVIDER, offer.region, zone, name)
        body = gce.instance_body(
            name=name,
            zone=zone,
            kind=kind,
            spot=offer.market is Market.SPOT,
            spec=spec,
            image=self._image,
            network=self._network,
        )
        if spec.gang is not None:
            self._placement(offer.region, spec.gang.placement, spec.gang.nodes, zone)
            body.resource_policies = [
                gce.placement_url(self.project, offer.region, spec.gang.placement)
            ]
        request = compute_v1.InsertInstanceRequest(
            project=self.project,
            zone=zone,
            instance_resource=body,
            request_id=request_id(idempotency_key),
        )
        try:
            operation = self._clients.instances.insert_unary(request=request)
        except Exception as exc:
            facts = exception_facts(exc)
            if facts is not None and is_already_exists(facts):
                return ref  # a retry after the first insert went through
            mapped = from_exception(exc, zone=zone)
            if mapped is None:
                raise
            raise mapped from exc
        operation = self._wait(operation, zone)
        errors = list(operation.error.errors)
        if errors:
            facts = operation_facts(errors)
            if is_already_exists(facts):
                return ref
            raise classify(facts, zone=zone)
        return ref

    def _placement(self, region: str, name: str, nodes: int, zone: str) -> None:
        """Make a gang's compact placement policy, once (the first node makes it; the others,
        and a retried node, find it made: alreadyExists)."""
        from google.cloud import compute_v1

        request = compute_v1.InsertResourcePolicyRequest(
            project=self.project,
            region=region,
            resource_policy_resource=gce.placement_policy(name, nodes),
            request_id=request_id(f"placement:{name}"),
        )
        try:
            self._clients.resource_policies.insert_unary(request=request)
        except Exception as exc:
            facts = exception_facts(exc)
            if facts is not None and is_already_exists(facts):
                return
            mapped = from_exception(exc, zone=zone)
            if mapped is None:
                raise
            raise mapped from exc

    def release_placement(self, region: str, placement: str) -> bool:
        """Delete a gang's compact resource policy (resourcePolicies.delete): True once it is
        gone (404: gone already), False while a VM still names it (in use)."""
        from google.cloud import compute_v1

        # No requestId: deleting again is harmless (404), and a reused id would hand back the
        # first attempt's refusal while a VM still named the policy.
        request = compute_v1.DeleteResourcePolicyRequest(
            project=self.project, region=region, resource_policy=placement
        )
        try:
            operation = self._clients.resource_policies.delete_unary(request=request)
        except Exception as exc:
            facts = exception_facts(exc)
            if facts is not None and facts.status == 404:
                return True
            if facts is not None and is_in_use(facts):
                return False
            mapped = from_exception(exc)
            if mapped is None:
                raise
            raise mapped from exc
        errors = list(operation.error.errors)
        if errors:
            facts = operation_facts(errors)
            if is_in_use(facts):
                return False
            raise classify(facts)
        return True

    def _wait(self, operation: Any, zone: str) -> Any:
        """Wait for an insert to finish (stockouts show only then), up to the launch timeout."""
        from google.cloud import compute_v1

        deadline = self._clock() + self._launch_timeout
        for _ in range(MAX_WAITS):
            if operation.status == compute_v1.Operation.Status.DONE or self._clock() >= deadline:
                break
            with translated(zone=zone):
                operation = self._clients.zone_operations.wait(
                    project=self.project, zone=zone, operation=operation.name
                )
        return operation

    def describe(self, refs: Iterable[InstanceRef]) -> list[InstanceStatus]:
        """State per instance: one instance list per zone, plus its preemptions when needed."""
        refs = list(refs)
        by_zone: dict[str, list[InstanceRef]] = defaultdict(list)
        for ref in refs:
            if not ref.zone:
                raise ProviderError(
                    f"GCP instance {ref.instance_id} has no zone", provider=PROVIDER
                )
            by_zone[ref.zone].append(ref)
        if not by_zone:
            return []
        with ThreadPoolExecutor(max_workers=min(len(by_zone), self._max_workers)) as pool:
            futures = {z: pool.submit(self._describe_zone, z, rs) for z, rs in by_zone.items()}
            found = {z: f.result() for z, f in futures.items()}
        return [found[ref.zone][ref] for ref in refs if ref.zone]

    def _describe_zone(
        self, zone: str, refs: list[InstanceRef]
    ) -> dict[InstanceRef, InstanceStatus]:
        from google.cloud import compute_v1

        instances = compute_v1.ListInstancesRequest(
            project=self.project, zone=zone, filter=gce.MANAGED_FILTER
        )
        operations = compute_v1.ListZoneOperationsRequest(
            project=self.project, zone=zone, filter=gce.PREEMPTED_FILTER
        )
        with translated(zone=zone):
            listed = {i.name: i for i in self._clients.instances.list(request=instances)}
        settled = {"RUNNING", "PROVISIONING", "STAGING"}
        preemptions: dict[str, gce.Preemption] = {}
        if any(
            r.instance_id not in listed or listed[r.instance_id].status not in settled for r in refs
        ):
            with translated(zone=zone):
                for op in self._clients.zone_operations.list(request=operations):
                    target = basename(op.target_link)  # compare basenames (REFERENCE §2.5)
                    seen = preemptions.get(target)
                    if seen is None or op.insert_time > seen.at:
                        preemptions[target] = gce.Preemption(target, op.insert_time, op.end_time)
        out: dict[InstanceRef, InstanceStatus] = {}
        for ref in refs:
            instance = listed.get(ref.instance_id)
            status = instance.status if instance is not None else None
            message = instance.status_message if instance is not None else ""
            times = gce.Times()
            if instance is not None:
                times = gce.Times(
                    instance.creation_timestamp,
                    instance.last_start_timestamp,
                    instance.last_stop_timestamp,
                )
            out[ref] = gce.instance_status(
                ref, status, message, preemptions.get(ref.instance_id), times
            )
        return out

    def terminate(self, ref: InstanceRef) -> None:
        """Delete the instance; one that is already gone counts as terminated."""
        if not ref.zone:
            raise ProviderError(f"GCP instance {ref.instance_id} has no zone", provider=PROVIDER)
        from google.cloud import compute_v1

        request = compute_v1.DeleteInstanceRequest(
            project=self.project,
            zone=ref.zone,
            instance=ref.instance_id,
            request_id=request_id(f"{ref.zone}/{ref.instance_id}", "delete"),
        )
        try:
            self._clients.instances.delete_unary(request=request)
        except Exception as exc:
            facts = exception_facts(exc)
            if facts is not None and facts.status == 404:
                return
            mapped = from_exception(exc, zone=ref.zone)
            if mapped is None:
                raise
            raise mapped from exc

    def close(self) -> None:
        self._clients.close()


def make_gcp_provider(settings: GcpSettings | None = None, **kwargs: Any) -> GcpProvider:
    """A provider for the configured settings (default: the `GPUOPT_GCP_*` environment).

    Raises ProviderDisabled with the one-line reason when GCP cannot run here.
    """
    current = settings if settings is not None else GcpSettings.from_env()
    reason = gcp_disabled_reason(settings=current)
    if reason is not None:
        raise ProviderDisabled(reason, provider=PROVIDER)
    return GcpProvider.from_settings(current, **kwargs)
