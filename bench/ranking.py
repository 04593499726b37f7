"""How fast `policies.engine.evaluate` ranks 100,000 offers under a policy that uses every rule.

The columnar engine ranks an `OfferTable` (built once per poll; its build is timed apart),
and the row engine it replaced (tests/helpers/row_engine.py) ranks the same offers in the same
run, after a check that both give the same answer.

The offers are the real AWS and GCP rows of the shared SkyPilot catalog snapshot, replicated
with seeded price noise (+-20%) and observation times shifted back half an hour per copy, so
some copies are stale and one is stamped in the future. Runs pinned to one core where the OS
allows. Each timing is a warm-up and then `--runs` calls; freeing the result is timed apart.
Each figure is the median of the process's CPU time (what the targets are judged on: the
cores here are shared, and wall time also counts other processes' turns on the pinned core)
beside the wall-clock median. Besides the headline figure it times the same offers shuffled
(cache-hostile), a policy that passes every offer (100k candidates to sort), and the reading
of every rejection (reasons are formatted when read) and of every candidate (records are
built when read). The garbage
collector stays on throughout, as in the daemon. Peak memory comes from separate runs under
tracemalloc. If `gpuhunt` is importable, its filter runs over the same rows for two ratios:
over `evaluate` on a built table (what the daemon runs: it keeps the table of the latest
offers, optimizer/jobs/offer_table.py) and over a one-shot ranking, table build included
(`evaluate_from_offer_list`: a caller with plain offers). `daemon` times the same offers
through a store (`daemon_figures`). Prints the figures and writes them to
bench/results/ranking.json.

    python -m bench.ranking [--offers 100000] [--runs 15]   (gpuhunt: pip install -e .[bench])
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np

from optimizer import hardware
from optimizer.model import Market, Offer
from policies.engine import OfferTable, Ranking, evaluate
from policies.schema import Policy
from providers.skypilot_catalog import read_directory
from tests.helpers import row_engine

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "ranking.json"
SHARED_DIR_ENV = "GPUOPT_SHARED_DIR"
NOW = datetime(2026, 4, 23, 12, tzinfo=UTC)
SHIFT = timedelta(minutes=30)  # per copy; copy 0 is stamped one SHIFT after NOW
SEED = 20260423

# Every rule is set, and each but `provider` (the rows are all AWS or GCP) rejects some rows:
# 4+ NVLink GPUs with FP64 and 1.8k bf16 TFLOPS in the EU, spot only, big hosts, capped per
# hour, per GPU-hour, against on-demand and by a monthly budget.
POLICY: dict[str, Any] = {
    "apiVersion": "gpuopt/v1",
    "kind": "Policy",
    "name": "bench-every-rule",
    "workload": {
        "type": "training",
        "gpus": 4,
        "gpu_memory_gib": 13,
        "min_tflops": {"bf16": 1500},
        "fp64": True,
        "interconnect": "nvlink",
        "gpu_models": [
            "A100-40GB",
            "A100-80GB",
            "H100-80GB",
            "H200-141GB",
            "V100-16GB",
            "V100-32GB",
            "L40S",
            "L4",
            "A10G",
            "P4",
        ],
        "cpu_memory_gib": 1024,
        "vcpus": 128,
    },
    "buffer": 0.2,
    "markets": ["spot"],
    "rank_by": "price_per_tflop",
    "max_price_age_hours": 6,
    "bid": {"max_usd_per_hour": 30, "max_usd_per_gpu_hour": 3.5, "max_fraction_of_on_demand": 0.25},
    "placement": {
        "providers": ["aws", "gcp"],
        "regions": {"allow": ["eu-*", "europe-*", "me-*", "il-*"], "deny": ["eu-south-*"]},
        "compliance": "gdpr",
        "countries": [],
    },
    "budget": {"monthly_usd": 14000},
}


def catalog_dir() -> Path:
    configured = os.environ.get(SHARED_DIR_ENV, "").strip()
    shared = Path(configured) if configured else ROOT.parent / "shared"
    return shared / "data" / "catalog"


def build_offers(count: int) -> list[Offer]:
    """`count` offers: the real rows, copied with price noise and older observation times."""
    directory = catalog_dir()
    if not (directory / "aws_gpu_vms.csv").is_file():
        sys.exit(f"shared catalog not found at {directory}; set {SHARED_DIR_ENV} to the shared dir")
    base = read_directory(directory, NOW)
    rng = random.Random(SEED)
    offers: list[Offer] = []
    copy = 0
    while len(offers) < count:
        observed_at = NOW + SHIFT - copy * SHIFT
        for row in base[: count - len(offers)]:
            values = {name: getattr(row, name) for name in Offer.__dataclass_fields__}
            values["usd_per_hour"] = round(row.usd_per_hour * rng.uniform(0.8, 1.2), 6)
            values["observed_at"] = observed_at
            offers.append(Offer(**values))
        copy += 1
    return offers


def pin_to_one_core() -> str:
    try:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    except (AttributeError, OSError) as exc:
        return f"not pinned ({exc.__class__.__name__})"
    return f"pinned to core {min(os.sched_getaffinity(0))}"


class Timings(list[float]):
    """Wall times in ms, with the process's CPU time of the same calls in `cpu`."""

    cpu: list[float]


def time_runs(fn: Callable[[], object], runs: int) -> tuple[Timings, list[float]]:
    """(call times, release times) in ms. Freeing a result (100k records) is timed apart:
    it is paid by whoever drops the ranking, not by the ranking. CPU time is taken too: the
    cores here are shared, and wall time counts other processes' turns on the pinned core."""
    fn()  # warm-up: imports, the hardware and region tables
    times = Timings()
    times.cpu = []
    releases: list[float] = []
    for _ in range(runs):
        cpu, start = time.process_time(), time.perf_counter()
        result = fn()
        times.append((time.perf_counter() - start) * 1000)
        times.cpu.append((time.process_time() - cpu) * 1000)
        start = time.perf_counter()
        del result
        releases.append((time.perf_counter() - start) * 1000)
    return times, releases


def figures(times: list[float]) -> dict[str, float]:
    out = {
        "median_ms": round(statistics.median(times), 2),
        "min_ms": round(min(times), 2),
        "max_ms": round(max(times), 2),
    }
    cpu = getattr(times, "cpu", None)
    if cpu:
        out["median_cpu_ms"] = round(statistics.median(cpu), 2)
    return out


def gpuhunt_query(policy: Policy, offers: list[Offer], runs: int) -> dict[str, Any] | str:
    """gpuhunt's own filter over the same rows, with the filters it can express."""
    try:
        from gpuhunt import (  # type: ignore[import-not-found]
            AcceleratorVendor,
            CatalogItem,
            QueryFilter,
        )
        from gpuhunt._internal.constraints import matches  # type: ignore[import-not-found]
    except ImportError:
        return "not installed"
    work, bid = policy.workload, policy.bid
    try:
        names = set(CatalogItem.__dataclass_fields__)  # fields vary across gpuhunt versions
        items = []
        for o in offers:
            row: dict[str, Any] = dict.fromkeys(names)
            row.update(
                provider=o.provider,
                location=o.zone or o.region,
                instance_name=o.instance_type,
                price=o.usd_per_hour,
                cpu=o.vcpus,
                memory=o.ram_gib,
                gpu_count=o.gpu_count,
                gpu_name=o.gpu_model,
                gpu_memory=o.gpu_memory_gib,
                spot=o.market == Market.SPOT,
                gpu_vendor=AcceleratorVendor(hardware.get(o.gpu_model).vendor)
                if o.gpu_count
                else None,
            )
            if "flags" in row:
                row["flags"] = []
            items.append(CatalogItem(**row))
        query = QueryFilter(
            provider=list(policy.placement.providers),
            min_cpu=work.vcpus or None,
            min_memory=work.cpu_memory_gib or None,
            min_gpu_count=work.gpus,
            gpu_name=list(work.gpu_models) or None,
            min_gpu_memory=policy.memory_need_gib() or None,
            max_price=bid.max_usd_per_hour,
            spot=True if policy.markets == ["spot"] else None,
        )

        def run() -> list[Any]:
            return sorted((i for i in items if matches(i, query)), key=lambda i: i.price)

        times, _ = time_runs(run, runs)
        return {**figures(times), "matches": len(run())}
    except Exception as exc:  # an API change in gpuhunt must not hide our own figures
        return f"error: {exc.__class__.__name__}: {exc}"


def daemon_figures(offers: list[Offer], policy: Policy, runs: int) -> dict[str, Any]:
    """What a launch's ranking costs in the daemon, with the offers in a store (a SQLite file,
    each copy in its own zone so every offer is a pool): read and build the table for each
    ranking (as before the table was kept), rank the kept table, a whole `launch_ranking`,
    and the kept table's update after one provider's poll (its offers read again)."""
    from optimizer.jobs.offer_table import keeper, latest_table
    from optimizer.jobs.ranking import launch_ranking
    from optimizer.store import Store

    pools = [replace(o, zone=f"{o.zone or o.region}-{i}") for i, o in enumerate(offers)]
    with tempfile.TemporaryDirectory() as folder, Store(f"sqlite:///{folder}/b.db") as store:
        store.create_all()
        store.prices.record_offers(pools)
        rebuilt, _ = time_runs(
            lambda: evaluate(policy, OfferTable.from_offers(store.prices.latest_offers()), NOW),
            3,
        )
        kept, _ = time_runs(lambda: evaluate(policy, latest_table(store), NOW), runs)
        launch, _ = time_runs(lambda: launch_ranking(store, policy.name, policy, NOW), runs)
        gcp = [replace(o, observed_at=o.observed_at + SHIFT) for o in pools if o.provider == "gcp"]
        updates = Timings()
        updates.cpu = []
        for step in range(3):
            store.prices.record_offers(gcp[step * 100 : (step + 1) * 100])
            cpu, start = time.process_time(), time.perf_counter()
            latest_table(store)
            updates.append((time.perf_counter() - start) * 1000)
            updates.cpu.append((time.process_time() - cpu) * 1000)
        return {
            "latest_offers": len(pools),
            "gcp_offers": len(gcp),
            "read_build_evaluate_per_ranking": figures(rebuilt),
            "evaluate_kept_table": figures(kept),
            "launch_ranking_kept_table": figures(launch),
            "kept_table_update_after_a_gcp_poll": figures(updates),
            "tables_built": keeper(store).builds,
        }


def peak_mib(fn: Callable[[], object]) -> float:
    """tracemalloc's peak over one call (what it allocates, its input excluded), MiB."""
    tracemalloc.start()
    result = fn()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del result
    return round(peak / 2**20, 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--offers", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()

    pinning = pin_to_one_core()
    policy = Policy.model_validate(POLICY)
    permissive = Policy.model_validate({"apiVersion": "gpuopt/v1", "kind": "Policy", "name": "all"})
    offers = build_offers(args.offers)
    table = OfferTable.from_offers(offers)
    ranking: Ranking = evaluate(policy, table, NOW)
    oracle = row_engine.evaluate(policy, offers, NOW)
    same = list(ranking.candidates) == list(oracle.candidates) and (
        ranking.rejections == oracle.rejections
    )

    build_times, _ = time_runs(lambda: OfferTable.from_offers(offers), args.runs)
    times, releases = time_runs(lambda: evaluate(policy, table, NOW), args.runs)
    from_list, _ = time_runs(lambda: evaluate(policy, offers, NOW), max(3, args.runs // 3))
    permissive_times, _ = time_runs(lambda: evaluate(permissive, table, NOW), args.runs)

    def permissive_and_read() -> Ranking:
        ranked = evaluate(permissive, table, NOW)
        list(ranked.candidates)  # builds the 100k records
        return ranked

    permissive_read, _ = time_runs(permissive_and_read, 5)

    def evaluate_and_read() -> Ranking:
        ranked = evaluate(policy, table, NOW)
        ranked.rejections  # noqa: B018  # builds the records and formats every reason
        return ranked

    read_times, _ = time_runs(evaluate_and_read, args.runs)
    shuffled = offers[:]
    random.Random(SEED).shuffle(shuffled)
    shuffled_table = OfferTable.from_offers(shuffled)
    shuffled_times, _ = time_runs(lambda: evaluate(policy, shuffled_table, NOW), args.runs)
    row_times, _ = time_runs(lambda: row_engine.evaluate(policy, offers, NOW), 5)
    row_permissive, _ = time_runs(lambda: row_engine.evaluate(permissive, offers, NOW), 3)
    hunt = gpuhunt_query(policy, offers, args.runs)
    daemon = daemon_figures(offers, policy, args.runs)
    memory = {
        "table_build": peak_mib(lambda: OfferTable.from_offers(offers)),
        "evaluate_on_table": peak_mib(lambda: evaluate(policy, table, NOW)),
        "evaluate_permissive_on_table": peak_mib(lambda: evaluate(permissive, table, NOW)),
        "row_engine_evaluate": peak_mib(lambda: row_engine.evaluate(policy, offers, NOW)),
    }

    by_rule = ranking.rejection_counts()
    result: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "affinity": pinning,
        "gc_enabled": gc.isenabled(),
        "offers": len(offers),
        "shapes": len(table.shape_ids()[1]),
        "runs": args.runs,
        "same_as_row_engine": same,
        "table_build": figures(build_times),
        "evaluate": figures(times),
        "evaluate_from_offer_list": figures(from_list),
        "release_result": figures(releases),
        "evaluate_and_read_every_rejection": figures(read_times),
        "evaluate_shuffled": figures(shuffled_times),
        "evaluate_permissive_policy": figures(permissive_times),
        "evaluate_permissive_and_read_every_candidate": figures(permissive_read),
        "row_engine_evaluate": figures(row_times),
        "row_engine_permissive_policy": figures(row_permissive),
        "peak_memory_mib": memory,
        "peak_memory_note": "tracemalloc peak of one call, its input excluded",
        "candidates": len(ranking.candidates),
        "rejections_by_rule": by_rule,
        "best": None if ranking.best is None else ranking.best.offer.to_dict(),
        "gpuhunt": hunt,
        "daemon": daemon,
        "targets_ms": {"evaluate": 10, "evaluate_permissive_policy": 30, "table_build": 30},
        "target_gpuhunt_over_evaluate": 4,
        "target_gpuhunt_over_one_shot": 2,
    }
    # Judged on CPU time (module docstring); wall medians are beside them.
    result["within_targets"] = {
        name: result[name]["median_cpu_ms"] <= limit for name, limit in result["targets_ms"].items()
    }
    if isinstance(hunt, dict):
        ratio = round(hunt["median_cpu_ms"] / result["evaluate"]["median_cpu_ms"], 2)
        result["gpuhunt_over_evaluate"] = ratio
        result["within_targets"]["gpuhunt_over_evaluate"] = ratio >= 4
        one_shot = round(
            hunt["median_cpu_ms"] / result["evaluate_from_offer_list"]["median_cpu_ms"], 2
        )
        result["gpuhunt_over_one_shot"] = one_shot
        result["within_targets"]["gpuhunt_over_one_shot"] = one_shot >= 2

    print(
        f"{len(offers):,} offers ({result['shapes']:,} shapes), policy {policy.name!r}, {pinning}"
    )
    print(f"same answer as the row engine: {same}; load average {result['load_average_1m']}")
    for name in (
        "table_build",
        "evaluate",
        "evaluate_from_offer_list",
        "evaluate_and_read_every_rejection",
        "evaluate_shuffled",
        "evaluate_permissive_policy",
        "evaluate_permissive_and_read_every_candidate",
        "row_engine_evaluate",
        "row_engine_permissive_policy",
        "release_result",
    ):
        f = result[name]
        cpu = f"{f['median_cpu_ms']} ms CPU, " if "median_cpu_ms" in f else ""
        print(
            f"{name}: median {cpu}{f['median_ms']} ms wall (min {f['min_ms']}, max {f['max_ms']})"
        )
    print(f"in the daemon ({daemon['latest_offers']:,} latest offers in a SQLite store):")
    for name in (
        "read_build_evaluate_per_ranking",
        "evaluate_kept_table",
        "launch_ranking_kept_table",
        "kept_table_update_after_a_gcp_poll",
    ):
        f = daemon[name]
        print(f"  {name}: median {f['median_cpu_ms']} ms CPU, {f['median_ms']} ms wall")
    print(f"peak memory (tracemalloc, MiB): {memory}")
    print(f"candidates: {result['candidates']}")
    for rule, count in by_rule.items():
        print(f"  rejected by {rule}: {count:,}")
    if isinstance(hunt, dict):
        ratio = result["gpuhunt_over_evaluate"]
        cpu = hunt["median_cpu_ms"]
        once = result["gpuhunt_over_one_shot"]
        print(
            f"gpuhunt filter: median {cpu} ms CPU (gpuhunt / evaluate = {ratio}; "
            f"gpuhunt / one-shot ranking, table build included = {once})"
        )
    else:
        print(f"gpuhunt: {hunt}")
    print(f"within targets: {result['within_targets']}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
