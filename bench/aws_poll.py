"""How many AWS calls a full GPU price refresh makes, and how long it takes, with every call
delayed by a fixed latency (a SkyPilot maintainer measured about 1.2 s per (type, region)
spot-history call against real AWS, skypilot#1437).

Against moto's threaded server on loopback (EC2: real instance-type and offering data for
~30 regions, so the GPU types are already there) plus a small local fake of the Price List
`GetProducts` endpoint (moto has none). A botocore `before-send` hook sleeps `--latency-ms`
before every request and counts it per region and operation. moto's spot prices and the fake's
list prices are placeholders: this measures call counts and concurrency, not prices.

Three runs:
- cold: a fresh provider: region list given, specs and zone maps fetched, offerings and spot
  history per region, and one Price List chain per GPU type (all regions in flight together);
- warm: the next poll an hour later: specs, zone maps and list prices come from the cache;
- naive: one region after another, one DescribeSpotPriceHistory call per GPU type (after one
  DescribeInstanceTypes listing per region): the loop the provider replaces.

    python bench/aws_poll.py [--latency-ms 50] [--regions 8] [--workers 8]

Prints figures and writes bench/results/aws_poll.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results" / "aws_poll.json"
# Regions where moto's offering data lists GPU types (it mirrors real offerings).
REGIONS = (
    "us-east-1",
    "us-east-2",
    "us-west-2",
    "eu-west-1",
    "eu-central-1",
    "eu-north-1",
    "ap-northeast-1",
    "ap-southeast-2",
    "ap-south-1",
    "ca-central-1",
)
_SCOPE = re.compile(r"Credential=[^/]+/\d{8}/([a-z0-9-]+)/([a-z0-9-]+)/aws4_request")


class Meter:
    """Counts requests per (region, operation) and delays each by a fixed latency."""

    def __init__(self, latency_s: float) -> None:
        self.latency_s = latency_s
        self.calls: Counter[tuple[str, str]] = Counter()
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()

    def before_send(self, request: Any, event_name: str = "", **_: Any) -> None:
        auth = request.headers.get("Authorization", b"")
        auth = auth.decode() if isinstance(auth, bytes) else auth
        scope = _SCOPE.search(auth)
        region = scope.group(1) if scope else "?"
        operation = event_name.rsplit(".", 1)[-1]
        if scope and scope.group(2) == "pricing":
            region = "pricing"
        with self._lock:
            self.calls[(region, operation)] += 1
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        time.sleep(self.latency_s)  # a bench, not a test: the wait is the point
        with self._lock:
            self.in_flight -= 1

    def reset(self) -> None:
        with self._lock:
            self.calls.clear()
            self.max_in_flight = 0

    def summary(self) -> dict[str, Any]:
        by_region: Counter[str] = Counter()
        by_operation: Counter[str] = Counter()
        for (region, operation), n in self.calls.items():
            by_region[region] += n
            by_operation[operation] += n
        per_region_ops: dict[str, dict[str, int]] = {}
        for (region, operation), n in sorted(self.calls.items()):
            per_region_ops.setdefault(region, {})[operation] = n
        return {
            "calls_total": sum(self.calls.values()),
            "max_calls_in_flight": self.max_in_flight,
            "calls_by_region": dict(sorted(by_region.items())),
            "calls_by_operation": dict(sorted(by_operation.items())),
            "calls_by_region_and_operation": per_region_ops,
        }


def _price_item(instance_type: str, region: str, usd: float) -> str:
    sku = f"{abs(hash((instance_type, region))) % 10**12:012d}"
    return json.dumps(
        {
            "product": {
                "productFamily": "Compute Instance",
                "attributes": {
                    "instanceType": instance_type,
                    "regionCode": region,
                    "operatingSystem": "Linux",
                    "tenancy": "Shared",
                    "preInstalledSw": "NA",
                    "capacitystatus": "Used",
                    "marketoption": "OnDemand",
                },
                "sku": sku,
            },
            "serviceCode": "AmazonEC2",
            "terms": {
                "OnDemand": {
                    f"{sku}.T": {
                        "priceDimensions": {
                            f"{sku}.T.R": {"unit": "Hrs", "pricePerUnit": {"USD": f"{usd:.10f}"}}
                        }
                    }
                }
            },
        }
    )


class _PriceList(BaseHTTPRequestHandler):
    """GetProducts over the AWS JSON protocol: every region, one page, placeholder prices."""

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
        fields = {f["Field"]: f["Value"] for f in body.get("Filters", [])}
        kind = fields.get("instanceType", "")
        items = [_price_item(kind, region, 1.0) for region in REGIONS] if kind else []
        data = json.dumps({"FormatVersion": "aws_v1", "PriceList": items}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-amz-json-1.1")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextmanager
def servers() -> Iterator[tuple[str, str]]:
    """(moto URL, Price List fake URL), both on loopback."""
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no access log per request
    os.environ.setdefault("MOTO_EC2_LOAD_DEFAULT_AMIS", "false")
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    host, port = moto.get_host_and_port()
    fake = ThreadingHTTPServer(("127.0.0.1", 0), _PriceList)
    thread = threading.Thread(target=fake.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{port}", f"http://127.0.0.1:{fake.server_address[1]}"
    finally:
        fake.shutdown()
        moto.stop()


def _session(meter: Meter) -> Any:
    import boto3

    session = boto3.session.Session(region_name="us-east-1")
    session.events.register("before-send", meter.before_send)
    return session


def naive(moto_url: str, regions: list[str], meter: Meter) -> tuple[float, int]:
    """One region after another, one spot-history call per GPU type: (seconds, rows)."""
    from providers.aws import specs

    session = _session(meter)
    rows = 0
    start = time.perf_counter()
    for region in regions:
        ec2 = session.client("ec2", region_name=region, endpoint_url=moto_url)
        for gpu in specs.list_gpu_types(ec2):
            reply = ec2.describe_spot_price_history(
                InstanceTypes=[gpu.instance_type],
                ProductDescriptions=["Linux/UNIX", "Linux/UNIX (Amazon VPC)"],
                StartTime=datetime.now(UTC),
            )
            rows += len(reply["SpotPriceHistory"])
    return time.perf_counter() - start, rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--latency-ms", type=float, default=50.0)
    parser.add_argument("--regions", type=int, default=8, help=f"1..{len(REGIONS)}")
    parser.add_argument("--workers", type=int, default=8)
    args = parser.parse_args()
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    os.environ["AWS_EC2_METADATA_DISABLED"] = "true"
    regions = list(REGIONS[: max(1, min(args.regions, len(REGIONS)))])

    import moto

    from providers.aws import AwsProvider

    meter = Meter(args.latency_ms / 1000)
    runs: list[dict[str, Any]] = []
    with servers() as (moto_url, pricing_url):
        # Load moto's data tables once, outside the timings.
        warmup = AwsProvider(
            regions[:1],
            session=_session(Meter(0)),
            endpoint_url={"ec2": moto_url, "pricing": pricing_url},
        )
        warmup.fetch_offers()

        now = [datetime.now(UTC)]
        aws = AwsProvider(
            regions,
            session=_session(meter),
            clock=lambda: now[0],
            max_workers=args.workers,
            endpoint_url={"ec2": moto_url, "pricing": pricing_url},
        )
        for mode in ("cold", "warm"):
            meter.reset()
            start = time.perf_counter()
            offers = aws.fetch_offers()
            seconds = time.perf_counter() - start
            runs.append(
                {
                    "mode": mode,
                    "wall_s": round(seconds, 3),
                    "offers": len(offers),
                    "problems": aws.problems,
                    **meter.summary(),
                }
            )
            now[0] += timedelta(hours=1)

        meter.reset()
        seconds, rows = naive(moto_url, regions, meter)
        runs.append(
            {"mode": "naive", "wall_s": round(seconds, 3), "spot_rows": rows, **meter.summary()}
        )

    by_mode = {r["mode"]: r for r in runs}
    result = {
        "bench": "aws_poll",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": "python bench/aws_poll.py " + " ".join(sys.argv[1:]),
        "python": platform.python_version(),
        "moto": moto.__version__,
        "machine": {
            "cores": os.cpu_count(),
            "platform": platform.platform(),
            "arch": platform.machine(),
        },
        "latency_ms": args.latency_ms,
        "workers": args.workers,
        "regions": regions,
        "note": "moto spot prices and the fake's list prices are placeholders: calls and time only",
        "runs": runs,
        "speedup_cold_vs_naive": round(by_mode["naive"]["wall_s"] / by_mode["cold"]["wall_s"], 1),
        "speedup_warm_vs_naive": round(by_mode["naive"]["wall_s"] / by_mode["warm"]["wall_s"], 1),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")

    print(f"{len(regions)} regions, {args.latency_ms:g} ms per call, {args.workers} workers")
    for run in runs:
        print(
            f"\n{run['mode']:>5}: {run['calls_total']} calls in {run['wall_s']:.2f} s, "
            f"at most {run['max_calls_in_flight']} at once"
            + (f", {run['offers']} offers" if "offers" in run else "")
        )
        for region, ops in run["calls_by_region_and_operation"].items():
            detail = ", ".join(f"{op} {n}" for op, n in ops.items())
            print(f"    {region:<15} {sum(ops.values()):>4}  ({detail})")
    print(
        f"\ncold poll {result['speedup_cold_vs_naive']}x, warm poll "
        f"{result['speedup_warm_vs_naive']}x faster than the naive loop"
    )
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
