"""Shared pieces for the daemon, alert and API tests: a clean environment, a fake offer
source, policy files, a config for a daemon on an ephemeral port, and `wait_until`.
Other test_daemon_*, test_alerts_* and test_api_* modules import from here.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from optimizer.api.serve import daemon_app
from optimizer.daemon.config import DaemonConfig
from optimizer.daemon.service import Daemon
from optimizer.model import Interconnect, Market, Offer

T = TypeVar("T")
T0 = datetime(2026, 1, 15, 12, 0, tzinfo=UTC)  # in the past: wall-clock daemons accept it
TOKEN = "test-api-token-7Qx2"
KEEP_ENV = {"GPUOPT_TEST_DATABASE_URL", "GPUOPT_SHARED_DIR"}


@pytest.fixture(autouse=True)
def daemon_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No GPUOPT_* setting from the developer's shell leaks into a test's config (the
    environment outranks the values a test passes)."""
    for name in list(os.environ):
        if name.startswith("GPUOPT_") and name not in KEEP_ENV:
            monkeypatch.delenv(name)


def wait_until(predicate: Callable[[], T], timeout: float = 10.0, what: str = "the condition") -> T:
    """Poll `predicate` every few milliseconds until it is truthy; fail after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.005)


def make_offer(**changes: Any) -> Offer:
    base = Offer(
        provider="aws",
        region="us-east-1",
        zone="use1-az1",
        instance_type="g5.xlarge",
        gpu_model="A10G",
        gpu_count=1,
        gpu_memory_gib=22.35,
        vcpus=4,
        ram_gib=16.0,
        interconnect=Interconnect.NONE,
        market=Market.SPOT,
        usd_per_hour=0.40,
        observed_at=T0,
        source="test",
    )
    return replace(base, **changes)


class FakeSource:
    """An OfferSource whose offers and failures a test sets."""

    def __init__(self, offers: Sequence[Offer] = (), name: str = "fake") -> None:
        self.name = name
        self.offers = list(offers)
        self.error: Exception | None = None
        self.problems: list[str] = []
        self.calls = 0

    def fetch_offers(self, regions: Sequence[str] | None = None) -> list[Offer]:
        self.calls += 1
        if self.error is not None:
            raise self.error
        if regions is None:
            return list(self.offers)
        return [o for o in self.offers if o.region in regions]


def policy_text(name: str = "small", *, cap: float | None = None, memory: float = 16) -> str:
    bid = f"bid: {{max_usd_per_hour: {cap}}}\n" if cap is not None else ""
    return (
        "apiVersion: gpuopt/v1\n"
        "kind: Policy\n"
        f"name: {name}\n"
        "workload:\n"
        "  gpus: 1\n"
        f"  gpu_memory_gib: {memory}\n"
        "markets: [spot, on_demand]\n"
        f"{bid}"
    )


def write_policy(directory: Path, filename: str, text: str) -> Path:
    """Write a policy file so the watcher sees a change even within one mtime tick."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / filename
    before = path.stat().st_mtime_ns if path.exists() else 0
    path.write_text(text, encoding="utf-8")
    stamp = max(time.time_ns(), before + 1_000_000)
    os.utime(path, ns=(stamp, stamp))
    return path


def make_config(data_dir: Path, **sections: Any) -> DaemonConfig:
    """A daemon on an ephemeral loopback port with fast loops; `sections` override keys."""
    values: dict[str, Any] = {
        "data_dir": data_dir,
        "providers": {"local": {"spot_interval_s": 3600, "on_demand_interval_s": 3600}},
        "api": {"host": "127.0.0.1", "port": 0, "token": TOKEN},
        "loops": {"reconcile_s": 3600, "deliver_s": 0.05, "watch_s": 0.05},
    }
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(values.get(key), dict):
            values[key] = {**values[key], **value}
        else:
            values[key] = value
    return DaemonConfig(**values)


@contextmanager
def running(config: DaemonConfig, **kwargs: Any) -> Iterator[Daemon]:
    """A started daemon serving the API (offer sources default to one empty fake), stopped
    afterwards."""
    kwargs.setdefault("sources", {"local": FakeSource()})
    daemon = Daemon(config, face=daemon_app, **kwargs)
    daemon.start()
    try:
        yield daemon
    finally:
        daemon.stop()


def api(daemon: Daemon, token: str | None = TOKEN) -> httpx.Client:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=daemon.url, headers=headers, timeout=10)


def test_wait_until_returns_the_first_truthy_value() -> None:
    calls = iter([0, None, 7])
    assert wait_until(lambda: next(calls), timeout=1) == 7


def test_wait_until_fails_with_what_it_waited_for() -> None:
    with pytest.raises(AssertionError, match="the moon"):
        wait_until(lambda: False, timeout=0.02, what="the moon")
