"""Calls and wall time of a full GCP offer refresh, against the local REST fake with latency.

Builds a synthetic world the size of GCP's GPU footprint (every GCP region in
policies/regions.csv, three zones each, the GPU machine types and n1 hosts of
tests/data/gcp, ~10k billing SKUs of which most are no GPU concern, as in the real catalog),
serves it from tests.helpers.gcp_fake with a fixed delay per request, and times:

- cold: no cached specs (aggregated accelerator + machine lists, and the SKUs);
- warm: specs cached (SKUs only: prices are fetched once per refresh);
- one region: warm, offers for europe-west4 only (still one SKU listing, not one per region);
- serial: cold with one worker, to show what running the three listings at once saves.

The fake ignores the machine-type `filter`; the world holds only the types that filter keeps.
Prints figures and writes bench/results/gcp_poll.json.

    python -m bench.gcp_poll [--latency-ms 40] [--repeat 3]   # from the repository's root
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import random
import statistics
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from google.auth.credentials import AnonymousCredentials

from policies import regions as region_table
from providers.gcp import GcpProvider
from tests.helpers.gcp_fake import COMPUTE_SERVICE_ID, FakeGcp  # a test helper: run with -m

ROOT = Path(__file__).resolve().parents[1]

RESULTS = ROOT / "bench" / "results" / "gcp_poll.json"
FIXTURES = ROOT / "tests" / "data" / "gcp"
FILLER_SERIES = ("E2", "N2", "N2D", "N4", "C2", "C2D", "C3", "C3D", "C4", "M1", "M3", "T2D", "Z3")
COMMITMENTS_PER_REGION = 60
STORAGE_PER_REGION = 40


class MemoryCache:
    def __init__(self) -> None:
        self.saved: dict[tuple[str, str], tuple[datetime, Any]] = {}

    def load_cached(self, provider: str, key: str) -> tuple[datetime, Any] | None:
        return self.saved.get((provider, key))

    def save_cached(self, provider: str, key: str, value: Any, fetched_at: datetime) -> None:
        self.saved[(provider, key)] = (fetched_at, value)


def _world(rng: random.Random) -> FakeGcp:
    """Every GCP region x 3 zones, each selling one of the fixture zones' catalogues."""
    template = FakeGcp.from_recorded(FIXTURES)
    zones = sorted(template.machine_types)
    names = [r.name for r in region_table.all_regions("gcp")]
    fixture_skus = template.skus[COMPUTE_SERVICE_ID]
    by_region = {}
    for sku in fixture_skus:
        by_region.setdefault(sku["serviceRegions"][0], []).append(sku)
    accelerators: dict[str, list[dict[str, Any]]] = {}
    machines: dict[str, list[dict[str, Any]]] = {}
    skus: list[dict[str, Any]] = []
    for index, region in enumerate(names):
        for letter in "abc":
            source = zones[(index * 3 + ord(letter)) % len(zones)]
            accelerators[f"{region}-{letter}"] = template.accelerator_types.get(source, [])
            machines[f"{region}-{letter}"] = template.machine_types[source]
        factor = rng.uniform(0.9, 1.3)
        for sku in by_region[["us-central1", "europe-west4"][index % 2]]:
            skus.append(_moved(sku, region, factor, rng))
        skus.extend(_filler(region, rng))
    rng.shuffle(skus)
    return FakeGcp(
        accelerator_types=accelerators, machine_types=machines, skus={COMPUTE_SERVICE_ID: skus}
    )


def _moved(sku: dict[str, Any], region: str, factor: float, rng: random.Random) -> dict[str, Any]:
    out = copy.deepcopy(sku)
    out["serviceRegions"] = [region]
    out["skuId"] = f"{rng.getrandbits(48):012X}"
    price = out["pricingInfo"][0]["pricingExpression"]["tieredRates"][0]["unitPrice"]
    usd = (int(price["units"]) + price["nanos"] / 1e9) * factor
    price["units"], price["nanos"] = str(int(usd)), round((usd - int(usd)) * 1e9)
    return out


def _filler(region: str, rng: random.Random) -> list[dict[str, Any]]:
    """SKUs no GPU offer needs: other VM series, commitments, disks."""
    out = []

    def sku(description: str, group: str, usage: str, family: str = "Compute") -> None:
        usd = rng.uniform(0.001, 0.05)
        out.append(
            {
                "skuId": f"{rng.getrandbits(48):012X}",
                "description": description,
                "category": {
                    "serviceDisplayName": "Compute Engine",
                    "resourceFamily": family,
                    "resourceGroup": group,
                    "usageType": usage,
                },
                "serviceRegions": [region],
                "pricingInfo": [
                    {
                        "pricingExpression": {
                            "usageUnit": "h",
                            "tieredRates": [
                                {
                                    "unitPrice": {
                                        "currencyCode": "USD",
                                        "units": "0",
                                        "nanos": round(usd * 1e9),
                                    }
                                }
                            ],
                        }
                    }
                ],
            }
        )

    for series in FILLER_SERIES:
        for resource, group in (("Core", "CPU"), ("Ram", "RAM")):
            sku(f"{series} Instance {resource} running in {region}", group, "OnDemand")
            sku(
                f"Spot Preemptible {series} Instance {resource} running in {region}",
                group,
                "Preemptible",
            )
    for n in range(COMMITMENTS_PER_REGION):
        sku(
            f"Commitment v1: {FILLER_SERIES[n % len(FILLER_SERIES)]} Cpu in {region} #{n}",
            "CPU",
            "Commit1Yr",
        )
    for n in range(STORAGE_PER_REGION):
        sku(f"Storage PD Capacity {n} in {region}", "SSD", "OnDemand", family="Storage")
    return out


def _run(fake: FakeGcp, *, cache: MemoryCache, regions: list[str] | None, workers: int) -> dict:
    fake.requests.clear()
    gcp = GcpProvider(
        "bench-project",
        client_options={"api_endpoint": fake.url},
        credentials=AnonymousCredentials(),
        transport="rest",
        cache=cache,
        max_workers=workers,
    )
    started = time.perf_counter()
    offers = gcp.fetch_offers(regions)
    seconds = time.perf_counter() - started
    gcp.close()
    calls = Counter(r.path.rsplit("/", 1)[-1] for r in fake.requests)
    return {
        "seconds": seconds,
        "offers": len(offers),
        "calls": dict(sorted(calls.items())),
        "total_calls": sum(calls.values()),
        "problems": len(gcp.problems),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--latency-ms", type=float, default=40.0)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    fake = _world(random.Random(7))
    fake.latency_s = args.latency_ms / 1000
    # Import and client start-up once, outside the timings.
    with fake:
        _run(fake, cache=MemoryCache(), regions=None, workers=8)
        scenarios = {
            "cold": lambda: _run(fake, cache=MemoryCache(), regions=None, workers=8),
            "warm": lambda: _run(fake, cache=warm, regions=None, workers=8),
            "one_region_warm": lambda: _run(fake, cache=warm, regions=["europe-west4"], workers=8),
            "cold_serial": lambda: _run(fake, cache=MemoryCache(), regions=None, workers=1),
        }
        warm = MemoryCache()
        _run(fake, cache=warm, regions=None, workers=8)
        results = {}
        for name, scenario in scenarios.items():
            runs = [scenario() for _ in range(args.repeat)]
            best = min(runs, key=lambda r: r["seconds"])
            best["median_seconds"] = round(statistics.median(r["seconds"] for r in runs), 3)
            best["seconds"] = round(best["seconds"], 3)
            results[name] = best
            print(
                f"{name:16} {best['seconds']:7.3f}s (median {best['median_seconds']:.3f}s)  "
                f"{best['total_calls']:3} calls {best['calls']}  {best['offers']} offers"
            )

    world = {
        "regions": len({z.rsplit("-", 1)[0] for z in fake.machine_types}),
        "zones": len(fake.machine_types),
        "machine_types": sum(len(v) for v in fake.machine_types.values()),
        "accelerator_types": sum(len(v) for v in fake.accelerator_types.values()),
        "skus": len(fake.skus[COMPUTE_SERVICE_ID]),
        "aggregated_page_size": fake.page_size,
        "sku_page_size": fake.sku_page_size,
    }
    out = {
        "bench": "gcp_poll",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "machine": {"cores": os.cpu_count(), "platform": platform.platform()},
        "latency_ms_per_request": args.latency_ms,
        "repeat": args.repeat,
        "world": world,
        "results": results,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    print(f"world: {world}")
    print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
