"""Price events of a real `gpuopt daemon` on the local cloud, read through the events API.

A fresh daemon ranks its policies once every first poll is in: that ranking is a baseline and
raises nothing. A restart with the same best offer raises nothing either. A policy edited so
that no offer satisfies it raises `best_offer.lost` when the edit is loaded, not at the next
price poll (the spot poll runs every 10 minutes here, as by default)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

from optimizer.model import Market, Offer
from tests.helpers import (
    DaemonProcess,
    FakeSource,
    make_config,
    make_offer,
    running,
    wait_until,
    write_policy,
)

pytestmark = pytest.mark.usefixtures("daemon_env")

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "local-train-policy.yaml"  # spot first, a bid cap of 0.7 x OD
PRICE_KINDS = ("best_offer.", "price.", "bid_cap.")


def on_demand_policy(memory: float) -> str:
    """One GPU with `memory` GiB on the local cloud's on-demand offers: the snapshot's list
    prices, which do not move with time (simulated spot prices do, every 10 minutes)."""
    return (
        "apiVersion: gpuopt/v1\n"
        "kind: Policy\n"
        "name: steady\n"
        f"workload: {{gpus: 1, gpu_memory_gib: {memory}}}\n"
        "markets: [on_demand]\n"
        "placement: {providers: [local]}\n"
    )


def ready(daemon: DaemonProcess) -> None:
    """Wait for /readyz: the first polls are done and the policies ranked once."""

    def answers() -> bool:
        try:
            return httpx.get(f"{daemon.url}/readyz", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(answers, 120, "the daemon's first polls")


def price_events(daemon: DaemonProcess) -> list[dict[str, Any]]:
    with daemon.client() as client:
        events = client.get("/events", params={"limit": 500}).json()["events"]
    return [e for e in events if e["kind"].startswith(PRICE_KINDS)]


def poll_runs(daemon: DaemonProcess, loop: str) -> float:
    text = httpx.get(f"{daemon.url}/metrics", timeout=5).text
    prefix = f'gpuopt_loop_runs_total{{loop="{loop}",outcome="ok"}}'
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(prefix))


def test_a_fresh_daemon_ranks_a_baseline_and_a_restart_with_the_same_best_raises_nothing(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    write_policy(data / "policies", "local-train.yaml", EXAMPLE.read_text())
    write_policy(data / "policies", "steady.yaml", on_demand_policy(12))
    daemon = DaemonProcess(data)
    try:
        ready(daemon)
        # Ranked after the spot poll alone, every spot pool lacked the on-demand price its
        # bid cap is a fraction of; the on-demand poll then made the first ranking look like
        # a new best offer and 286 pools crossing the cap.
        assert price_events(daemon) == []
    finally:
        daemon.stop()
    again = DaemonProcess(data)
    try:
        ready(again)
        assert [e for e in price_events(again) if e["policy"] == "steady"] == []
    finally:
        again.stop()


def test_a_policy_edited_down_to_no_offer_raises_best_offer_lost_when_it_loads(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    write_policy(data / "policies", "steady.yaml", on_demand_policy(12))
    daemon = DaemonProcess(data)
    try:
        ready(daemon)
        write_policy(data / "policies", "steady.yaml", on_demand_policy(1000))  # no such GPU
        lost = wait_until(
            lambda: [e for e in price_events(daemon) if e["kind"] == "best_offer.lost"],
            60,
            "best_offer.lost",
        )
        assert [(e["policy"], e["severity"]) for e in lost] == [("steady", "warning")]
        assert lost[0]["data"]["pool_before"].startswith("local/")
        # The ranking came with the edit: no price poll ran again meanwhile.
        assert poll_runs(daemon, "poll:local:spot") == 1
        assert poll_runs(daemon, "poll:local:on_demand") == 1
    finally:
        daemon.stop()


class SecondFetchWaits(FakeSource):
    """Answers the first fetch at once and holds the second (the other market's first poll)
    until `release` is set: the order in which a fresh daemon's two first polls end is
    otherwise a race."""

    def __init__(self, offers: Sequence[Offer]) -> None:
        super().__init__(offers)
        self.release = threading.Event()
        self._lock = threading.Lock()

    def fetch_offers(self, regions: Sequence[str] | None = None) -> list[Offer]:
        with self._lock:
            second = self.calls == 1
            self.calls += 1
        if second:
            assert self.release.wait(60), "the test never released the second poll"
        return list(self.offers)


CAPPED = """\
apiVersion: gpuopt/v1
kind: Policy
name: capped
workload: {gpus: 1, gpu_memory_gib: 16}
markets: [spot, on_demand]
bid: {max_fraction_of_on_demand: 0.7}
"""


def test_the_first_ranking_waits_for_every_first_poll(tmp_path: Path) -> None:
    spot = make_offer(market=Market.SPOT, usd_per_hour=0.3)
    on_demand = make_offer(zone=None, market=Market.ON_DEMAND, usd_per_hour=1.0)
    source = SecondFetchWaits([spot, on_demand])
    write_policy(tmp_path / "policies", "capped.yaml", CAPPED)
    with running(make_config(tmp_path), sources={"local": source}) as daemon:

        def first_polls_done() -> float:
            return sum(
                daemon.metrics.sample(
                    "gpuopt_loop_runs_total", {"loop": f"poll:local:{m}", "outcome": "ok"}
                )
                or 0
                for m in ("spot", "on_demand")
            )

        # One market's offers are in, the other's poll waits. Ranked now, spot alone would
        # have no on-demand price for its cap (or on-demand alone would be the best), and the
        # second poll would then raise best_offer.changed.
        wait_until(lambda: first_polls_done() == 1, 30, "the first poll")
        source.release.set()
        wait_until(lambda: daemon.readiness()[0], 30, "the second poll")
        kinds = [e.kind for e in daemon.store.events.list_events()]
        assert [k for k in kinds if k.startswith(PRICE_KINDS)] == []
        baseline = daemon.store.policies.price_signals()["capped"]
        assert baseline["best_pool"] == "aws/us-east-1/use1-az1/g5.xlarge/spot"
