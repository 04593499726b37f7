"""Multi-node offers and policies: the fabric each type has (sourced table, live AWS EFA
counts), catalog files with and without the columns, the policy's `fabric` rule, `nodes`."""

from __future__ import annotations

import io
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest

from optimizer import hardware
from optimizer.catalog import iter_offers, write_catalog
from optimizer.costs import GroupBy
from optimizer.jobs.ledger import Ledger
from optimizer.jobs.spec import JobSpecError, parse_job_spec
from optimizer.model import Fabric, Market, Offer
from optimizer.store import Store
from policies.engine import evaluate
from policies.rules import fabric_meets
from providers.aws.specs import gpu_type
from tests.helpers.engine import T0, offer, policy


@pytest.mark.parametrize(
    ("provider", "itype", "fabric", "interfaces"),
    [
        ("aws", "p5.48xlarge", Fabric.EFA, 32),
        ("aws", "p5en.48xlarge", Fabric.EFA, 16),
        ("aws", "p4d.24xlarge", Fabric.EFA, 4),
        ("aws", "g6e.24xlarge", Fabric.EFA, 2),
        ("aws", "g5.12xlarge", Fabric.EFA, 1),
        ("aws", "g5.xlarge", Fabric.NONE, 0),  # smaller g5 sizes have no EFA
        ("gcp", "a3-megagpu-8g", Fabric.GPUDIRECT_TCPXO, 8),
        ("gcp", "a3-highgpu-8g", Fabric.GPUDIRECT_TCPX, 4),
        ("gcp", "a3-ultragpu-8g", Fabric.GPUDIRECT_RDMA, 8),
        ("gcp", "g2-standard-4", Fabric.NONE, 0),
        ("local", "p5.48xlarge", Fabric.EFA, 32),  # the local cloud sells the snapshot's types
    ],
)
def test_fabric_of_a_type(provider: str, itype: str, fabric: Fabric, interfaces: int) -> None:
    spec = hardware.instance_fabric(provider, itype)
    assert (spec.fabric, spec.interfaces) == (fabric, interfaces)


def test_aws_reads_the_efa_interface_count_describe_instance_types_gives() -> None:
    info = {
        "InstanceType": "p5.48xlarge",
        "GpuInfo": {"Gpus": [{"Name": "H100", "Count": 8, "MemoryInfo": {"SizeInMiB": 81559}}]},
        "NetworkInfo": {"EfaSupported": True, "EfaInfo": {"MaximumEfaInterfaces": 32}},
    }
    found = gpu_type(info)
    assert found is not None and (found.efa, found.efa_interfaces) == (True, 32)


def test_a_catalog_without_fabric_columns_takes_the_types_fabric_and_round_trips() -> None:
    rows = [offer(instance_type="p5.48xlarge"), offer(instance_type="g5.xlarge")]
    old_columns = io.StringIO()
    write_catalog(rows, old_columns)
    header, *lines = old_columns.getvalue().splitlines()
    names = header.split(",")
    keep = [i for i, n in enumerate(names) if n not in ("fabric", "fabric_interfaces")]
    text = "\n".join(",".join(line.split(",")[i] for i in keep) for line in [header, *lines])
    read = list(iter_offers(io.StringIO(text + "\n")))
    assert [(o.fabric, o.fabric_interfaces) for o in read] == [(Fabric.EFA, 32), (Fabric.NONE, 0)]

    written = io.StringIO()
    write_catalog(read, written)
    assert list(iter_offers(io.StringIO(written.getvalue()))) == read


def _offers() -> list[Offer]:
    return [
        offer(instance_type="p4de.24xlarge", fabric=Fabric.EFA, fabric_interfaces=4),
        offer(instance_type="x.24xlarge", usd_per_hour=10.0),
        offer(
            instance_type="a3-megagpu-8g",
            provider="gcp",
            region="europe-west4",
            zone=None,
            fabric=Fabric.GPUDIRECT_TCPXO,
            fabric_interfaces=8,
            usd_per_hour=20.0,
        ),
    ]


def test_fabric_rule_keeps_only_offers_with_the_fabric_asked_for() -> None:
    efa = evaluate(policy(workload={"nodes": 2, "fabric": "efa"}), _offers(), T0)
    assert [c.offer.instance_type for c in efa.candidates] == ["p4de.24xlarge"]
    reasons = {r.offer.instance_type: (r.rule, r.reason) for r in efa.rejections}
    assert reasons["x.24xlarge"] == ("fabric", "inter-node fabric none; efa required")
    assert reasons["a3-megagpu-8g"][1] == "inter-node fabric gpudirect_tcpxo; efa required"

    fast = evaluate(policy(workload={"fabric": "fast"}), _offers(), T0)
    assert [c.offer.instance_type for c in fast.candidates] == ["a3-megagpu-8g", "p4de.24xlarge"]
    anything = evaluate(policy(workload={"nodes": 2}), _offers(), T0)
    assert len(anything.candidates) == 3


def test_fabric_needs() -> None:
    assert fabric_meets("gpudirect_tcpx", "gpudirect-tcpx")
    assert not fabric_meets("gpudirect_tcpx", "gpudirect-tcpxo")
    assert fabric_meets("none", "any") and not fabric_meets("none", "fast")


def test_a_policy_rejects_an_unknown_fabric_and_too_many_nodes() -> None:
    with pytest.raises(ValueError, match="fabric"):
        policy(workload={"fabric": "infiniband"})
    with pytest.raises(ValueError, match="nodes"):
        policy(workload={"nodes": 65})


def test_job_spec_nodes_and_reserved_rendezvous_variables() -> None:
    base = "name: t\npolicy: p\nrun: python x.py\ncheckpoint_dir: /tmp/c\n"
    assert parse_job_spec(base).nodes is None
    assert parse_job_spec(base + "nodes: 2\n").nodes == 2
    with pytest.raises(JobSpecError, match=r"<job>:5:\d+: nodes: "):
        parse_job_spec(base + "nodes: 0\n")
    with pytest.raises(JobSpecError, match="GPUOPT_MASTER_ADDR is set by gpuopt"):
        parse_job_spec(base + "env: {GPUOPT_MASTER_ADDR: x}\n")


def test_the_ledger_counts_a_gang_as_one_attempt_of_two_instances(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    store.create_all()
    start, end = T0, T0 + timedelta(hours=2)
    spot = offer(observed_at=start, market=Market.SPOT, usd_per_hour=10.0)
    store.prices.record_offers([spot, replace(spot, market=Market.ON_DEMAND, zone=None)])
    job = store.jobs.add_job("pair", "p", {"run": "x", "nodes": 2}, at=start)
    for rank in (0, 1):
        key = f"{job}-1" if rank == 0 else f"{job}-1-n1"
        store.jobs.create_attempt(
            job, 1 + rank, key, spot, "s", start, gang=1, node_rank=rank, nodes=2
        )
        store.jobs.update_attempt(
            key,
            instance_id=f"i-{rank}",
            launched_at=start,
            job_started_at=start,
            ended_at=end,
            state="ended",
            instance_gone=True,
            terminated_at=end,
            terminated_by="gpuopt",
        )
    ledger = Ledger(store)
    live = ledger.lines(now=end + timedelta(days=1))
    assert [(line.attempt, line.instance_id) for line in live] == [(1, "i-0"), (1, "i-1")]
    assert ledger.freeze(end + timedelta(days=1)) == 2
    for by in (GroupBy.JOB, GroupBy.POLICY):  # summed in Python, and by the database
        (group,) = ledger.groups(by, now=end + timedelta(days=1))
        assert group.attempts == 1
        assert group.cost.spend_usd == pytest.approx(2 * 2 * 10.0)  # two instances, 2 h each
    store.close()
