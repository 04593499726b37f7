"""The job reconciler's observation paths that the local cloud does not exercise."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from optimizer.daemon.config import ProviderConfig
from optimizer.daemon.loops.queue import WAIT_S, QueueLoop
from optimizer.daemon.providers import ProviderHandle
from optimizer.jobs.reconcile import JobReconciler
from optimizer.jobs.views import finished_keys
from optimizer.store import Store
from providers.aws import AwsConfig
from tests.helpers import make_offer

NOW = datetime(2026, 11, 30, 12, tzinfo=UTC)
QUEUE = "https://sqs.us-east-1.amazonaws.com/123456789012/gpuopt-events"


@dataclass
class Event:
    instance_id: str
    kind: str
    detail: str = ""


class QueueSource:
    """An AWS-like source with an interruption queue holding the given events."""

    name = "aws"
    problems: tuple[str, ...] = ()

    def __init__(self, events: list[Event]) -> None:
        self.events = events
        self.waits: list[int] = []

    def fetch_offers(self, regions: Any = None) -> list[Any]:
        return []

    def poll_interruptions(self, *, wait_seconds: int, record: Any) -> list[Event]:
        self.waits.append(wait_seconds)
        record(self.events)
        return self.events


def test_queue_notices_are_recorded_on_the_matching_attempts(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    store.create_all()
    job = store.jobs.add_job("q", "p", {"run": "x", "checkpoint_dir": "/c"})
    offer = make_offer(observed_at=NOW)
    for n, instance in ((1, "i-spot"), (2, "i-gone")):
        store.jobs.create_attempt(job, n, f"{job}-{n}", offer, "h", NOW)
        store.jobs.update_attempt(f"{job}-{n}", instance_id=instance)
    source = QueueSource(
        [
            Event("i-spot", "spot_interruption", "terminate"),
            Event("i-gone", "state_change", "terminated"),
            Event("i-someone-elses", "spot_interruption", "terminate"),
        ]
    )
    woken: list[bool] = []
    handle = ProviderHandle.given("aws", AwsConfig(interruption_queue_url=QUEUE), source)
    loop = QueueLoop(handle, store, lambda: NOW, wake=lambda: woken.append(True))
    assert loop.run_once() == 2
    assert source.waits == [WAIT_S]  # a long poll, on its own loop
    assert woken == [True]  # the reconcile loop acts on it now
    spot, gone = store.jobs.attempt(f"{job}-1"), store.jobs.attempt(f"{job}-2")
    assert spot is not None and spot.notice_at == NOW and not spot.instance_gone
    assert gone is not None and gone.instance_gone and gone.notice_at is None
    assert loop.run_once() == 0 and woken == [True]  # already recorded: nothing new, no wake
    store.close()


def test_a_provider_without_a_queue_is_not_polled(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    store.create_all()
    source = QueueSource([])
    handle = ProviderHandle.given("aws", ProviderConfig(), source)  # no queue configured
    loop = QueueLoop(handle, store, lambda: NOW, wake=lambda: None)
    assert loop.run_once() == 0 and source.waits == []
    store.close()


def test_attempts_of_groups_every_listed_job_in_number_order(store: Store) -> None:
    offer = make_offer(observed_at=NOW)
    jobs = [
        store.jobs.add_job(f"j{i}", "p", {"run": "x", "checkpoint_dir": "/c"}) for i in range(3)
    ]
    for job, count in zip(jobs, (3, 0, 1), strict=True):
        for n in reversed(range(1, count + 1)):  # written out of order
            store.jobs.create_attempt(job, n, f"{job}-{n}", offer, "h", NOW)
    grouped = store.jobs.attempts_of([jobs[0], jobs[1], jobs[2], jobs[0]])
    assert {job: [a.number for a in rows] for job, rows in grouped.items()} == {
        jobs[0]: [1, 2, 3],
        jobs[2]: [1],
    }
    assert grouped[jobs[0]] == store.jobs.attempts(jobs[0])  # the same records as one job's query
    assert store.jobs.attempts_of([]) == {}


def test_a_handed_over_attempt_finished_when_its_job_exited_0_without_a_stop(
    store: Store,
) -> None:
    offer = make_offer(observed_at=NOW)
    job = store.jobs.add_job("f", "p", {"run": "x", "checkpoint_dir": "/c"})
    exits = {  # end reason, the agent's job_exited
        1: ("migrated", {"exit_code": 0, "stopped": False}),  # finished on its own
        2: ("migrated", {"exit_code": 0, "stopped": True}),  # exited 0 after its stop
        3: ("preempted", {"exit_code": 0, "stopped": False}),  # finished after a notice
        4: ("migrated", {"exit_code": 143, "stopped": True}),  # checkpointed
        5: ("migrated", {"exit_code": 0, "stopped": False, "adopted": True}),  # status unknown
        6: ("succeeded", {"exit_code": 0, "stopped": False}),  # the ordinary end: not handed over
    }
    for n, (reason, data) in exits.items():
        key = f"{job}-{n}"
        store.jobs.create_attempt(job, n, key, offer, "h", NOW)
        store.jobs.record_agent_events(key, [{"id": key, "kind": "job_exited", "data": data}], NOW)
        store.jobs.update_attempt(key, ended_at=NOW, end_reason=reason, state="ended")
    assert finished_keys(store, store.jobs.attempts(job)) == {f"{job}-1", f"{job}-3"}


class RecordingSource:
    """Launches succeed and are remembered; instances land in zone `-a` of the region."""

    def __init__(self) -> None:
        self.launched: list[tuple[str | None, str]] = []

    def launch(self, offer: Any, spec: Any, key: str) -> Any:
        from providers.base import InstanceRef

        self.launched.append((offer.zone, offer.market.value))
        return InstanceRef("aws", offer.region, f"{offer.region}a", f"i-{key}")


def test_a_cooled_down_zonal_attempt_also_avoids_its_regional_on_demand_offer(
    tmp_path: Path,
) -> None:
    """On-demand prices are per region (zone None) but an attempt records its instance's
    zone: a cooldown on the attempt's pool must still keep the launch off that offer."""
    from optimizer.jobs.context import PassMemo
    from optimizer.jobs.machine import Launch
    from optimizer.jobs.recovery import Failover
    from optimizer.model import Market
    from policies.loader import parse_policy

    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    store.create_all()
    cheap = make_offer(zone=None, market=Market.ON_DEMAND, usd_per_hour=1.0, observed_at=NOW)
    dearer = make_offer(
        zone=None, market=Market.ON_DEMAND, usd_per_hour=1.5, region="us-west-2", observed_at=NOW
    )
    store.prices.record_offers([cheap, dearer])
    policy = parse_policy(
        "apiVersion: gpuopt/v1\nkind: Policy\nname: p\n"
        "workload: {gpus: 1, gpu_memory_gib: 16}\nmarkets: [on_demand]\n"
    )
    job_id = store.jobs.add_job("j", "p", {"run": "x", "checkpoint_dir": "/c"})
    job = store.jobs.get_job("j")
    assert job is not None
    # The last attempt ran on the cheap offer's instance, in zone us-east-1a, and was lost.
    store.jobs.add_cooldown(
        ("aws", "us-east-1", "us-east-1a", "g5.xlarge", "on_demand"), NOW.replace(hour=13), "lost"
    )
    source = RecordingSource()
    ctx = SimpleNamespace(
        store=store,
        now=NOW,
        providers={"aws": ProviderHandle.given("aws", ProviderConfig(), source)},
        leading=lambda: True,
        memo=PassMemo(),
    )
    launched, why = JobReconciler(lambda: "http://127.0.0.1:1").launcher.walk(
        ctx,  # type: ignore[arg-type]
        job,
        Launch(markets=(Market.ON_DEMAND,)),
        policy,
        Failover(),
    )
    assert launched, why
    assert source.launched == [(None, "on_demand")]
    (attempt,) = store.jobs.attempts(job_id)
    assert attempt.region == "us-west-2"  # not back into the pool that was just cooled down
    store.close()
