"""Migration leaves gangs where they are: a multi-node job is never a candidate of the
migration pass (it is never chosen to move, and takes no slot of the disruption budget),
while a single-node job in the same place moves."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from optimizer.jobs.gang import gang_key
from optimizer.jobs.migration import Reason, plan
from optimizer.jobs.migration_inputs import gather
from optimizer.store import Store
from policies.loader import parse_policy
from tests.helpers import make_offer

NOW = datetime(2026, 12, 1, 12, tzinfo=UTC)
DEAR = make_offer(zone="use1-az1", usd_per_hour=2.0, observed_at=NOW)
CHEAP = make_offer(zone="use1-az2", usd_per_hour=0.40, observed_at=NOW)
# The jobs' pool costs more than the bid cap: a forced move (no price history needed), and
# one at a time (disruption_budget 1).
POLICY = parse_policy(
    "apiVersion: gpuopt/v1\nkind: Policy\nname: p\nworkload: {gpus: 1}\n"
    "bid: {max_usd_per_hour: 1}\nmigration: {enabled: true, disruption_budget: 1}\n"
)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    store.create_all()
    store.prices.record_offers([DEAR, CHEAP])
    yield store
    store.close()


def run(store: Store, name: str, nodes: int) -> None:
    """A job running on DEAR for an hour: one attempt of `nodes` rows, each node's job started."""
    store.jobs.add_job(name, "p", {"run": "x", "checkpoint_dir": f"/{name}", "nodes": nodes})
    job = store.jobs.get_job(name)
    assert job is not None
    began = NOW - timedelta(hours=1)
    for rank in range(nodes):
        key = gang_key(job.id, 1, rank)
        gang = 1 if nodes > 1 else None
        store.jobs.create_attempt(
            job.id, 1 + rank, key, DEAR, "sha", began, gang=gang, node_rank=rank, nodes=nodes
        )
        store.jobs.update_attempt(
            key,
            instance_id=f"i-{key}",
            state="launched",
            registered_at=began,
            probe_status="pass",
            job_started_at=began,
        )
    moved = store.jobs.transition_job(
        job.id, expected="pending", state="running", reason="running", at=began
    )
    assert moved is not None


def test_a_gang_is_never_chosen_to_move_nor_holds_a_single_nodes_move_back(store: Store) -> None:
    run(store, "pair", nodes=2)  # first in line: it would take the one slot
    run(store, "solo", nodes=1)
    jobs = store.jobs.live_jobs()
    attempts = store.jobs.attempts_of(j.id for j in jobs)
    inputs = gather(store, jobs, attempts, {"p": POLICY}, NOW)
    assert inputs is not None
    assert [j.name for j in inputs.jobs] == ["solo"]
    decided = plan(inputs.jobs, inputs.markets, NOW)
    solo = store.jobs.get_job("solo")
    assert solo is not None
    cheap = ("aws", "us-east-1", "use1-az2", "g5.xlarge", "spot")
    assert [(m.job_id, m.reason, m.targets[0]) for m in decided.moves] == [
        (solo.id, Reason.BID_CAP, cheap)
    ]
    assert decided.held == ()
