"""Probe results over HTTP on a real loopback server: agents report them with their own token
(POST /agent/v1/events), `GET /probes` and `gpuopt probes list` show the history, and
`GET /offers?policy=` ranks on the measured figures (and says so) once they are stored."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from optimizer.cli import app
from optimizer.daemon.service import Daemon
from optimizer.model import Interconnect, Market
from optimizer.store import token_sha256
from tests.helpers import (
    TOKEN,
    FakeSource,
    api,
    make_config,
    make_offer,
    running,
    steady_clock,
    wait_until,
    write_policy,
)
from tests.helpers.daemon import without_job_passes
from tests.helpers.probes import probe_json

pytestmark = pytest.mark.usefixtures("daemon_env")

POLICY = """\
apiVersion: gpuopt/v1
kind: Policy
name: perflop
markets: [on_demand]
rank_by: price_per_tflop
"""


def node(kind: str, model: str, usd: float, provider: str = "aws"):
    return make_offer(
        provider=provider, instance_type=kind, gpu_model=model, gpu_count=8, gpu_memory_gib=80.0,
        interconnect=Interconnect.NVLINK, market=Market.ON_DEMAND, zone=None, usd_per_hour=usd,
    )  # fmt: skip


# By the datasheet the H100 node is cheaper per TFLOP: $40 / 7912 against $20 / 2496.
A100 = node("p4de.24xlarge", "A100-80GB", 20.0)
H100 = node("p5.48xlarge", "H100-80GB", 40.0)


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    write_policy(tmp_path / "policies", "perflop.yaml", POLICY)
    source = FakeSource([A100, H100])
    config = make_config(tmp_path)
    with running(config, sources={"local": source}, clock=steady_clock()) as d, api(d) as client:
        wait_until(lambda: client.get("/readyz").status_code == 200, what="readiness")
        wait_until(lambda: len(d.store.prices.latest_offers()) == 2, what="offers stored")
        without_job_passes(d)  # the tests play the jobs' agents
        yield d


def attempt(daemon: Daemon, job: str, offer: Any) -> str:
    store = daemon.store
    job_id = store.jobs.add_job(job, "perflop", {"run": "x"})
    key = f"{job}-1"
    store.jobs.create_attempt(job_id, 1, key, offer, token_sha256(f"token-{key}"), daemon.clock())
    # The job is over, so the reconciler leaves its attempt alone: launching it on a provider
    # the daemon does not run would end it, and with it the agent token the test reports with.
    store.jobs.transition_job(
        job_id, expected="pending", state="succeeded", reason="done", at=daemon.clock()
    )
    return key


def report(daemon: Daemon, key: str, status: str, result: dict[str, Any]) -> httpx.Response:
    body = {
        "attempt_key": key,
        "events": [
            {
                "id": f"{key}-probe",
                "kind": "probe_result",
                "at": daemon.clock().isoformat(),
                "data": {"status": status, "result": result},
            }
        ],
    }
    headers = {"Authorization": f"Bearer token-{key}"}
    return httpx.post(f"{daemon.url}/agent/v1/events", json=body, headers=headers, timeout=10)


def ranked(daemon: Daemon) -> list[dict[str, Any]]:
    with api(daemon) as client:
        answer = client.get("/offers", params={"policy": "perflop"})
    assert answer.status_code == 200, answer.text
    return answer.json()["candidates"]


def cli(daemon: Daemon, *args: str) -> Any:
    return CliRunner().invoke(
        app, ["probes", "list", *args, "--api", daemon.url], env={"GPUOPT_API_TOKEN": TOKEN}
    )


def test_reported_probes_are_listed_and_rank_the_offers_on_their_figures(daemon: Daemon) -> None:
    before = ranked(daemon)
    assert [c["offer"]["instance_type"] for c in before] == ["p5.48xlarge", "p4de.24xlarge"]
    assert [c["throughput"] for c in before] == ["datasheet", "datasheet"]

    # Two H100 runs measure 300 TFLOPS bf16 per GPU; the second is the same batch sent again.
    for job in ("slow-a", "slow-b"):
        key = attempt(daemon, job, H100)
        assert report(daemon, key, "pass", probe_json(300.0)).json()["ack"] == [f"{key}-probe"]
        assert report(daemon, key, "pass", probe_json(300.0)).status_code == 200
    sick = attempt(daemon, "sick", A100)
    report(daemon, sick, "fail", probe_json(20.0))
    # An instance on the daemon's own host (the local cloud) measures the host's GPU: listed as
    # measured on the host, never as the type's figures.
    host = attempt(daemon, "host", node("p5.48xlarge", "H100-80GB", 40.0, provider="local"))
    report(daemon, host, "pass", probe_json(900.0))

    with api(daemon) as client:
        listed = client.get("/probes").json()["probes"]
        assert [p["job"] for p in listed] == ["host", "sick", "slow-b", "slow-a"]
        assert [p["simulated"] for p in listed] == [False, False, False, False]
        assert [p["source"] for p in listed] == ["host", "measured", "measured", "measured"]
        assert listed[2]["tflops"] == {"bf16": 300.0} and listed[2]["status"] == "pass"
        page = client.get("/probes", params={"instance_type": "p5.48xlarge", "limit": 2}).json()
        rest = client.get(
            "/probes", params={"instance_type": "p5.48xlarge", "before": page["probes"][-1]["id"]}
        ).json()
        assert [p["job"] for p in page["probes"] + rest["probes"]] == ["host", "slow-b", "slow-a"]
        assert client.get("/probes", params={"limit": 0}).status_code == 422

    # $40 / (8 x 300) = 0.0167 per TFLOP-hour against the A100's datasheet $20 / 2496 = 0.0080.
    after = ranked(daemon)
    assert [c["offer"]["instance_type"] for c in after] == ["p4de.24xlarge", "p5.48xlarge"]
    measured = after[1]
    assert (measured["throughput"], measured["measured_n"], measured["node_tflops"]) == (
        "measured",
        2,
        2400.0,
    )
    assert measured["measured_age_s"] >= 0
    assert after[0]["throughput"] == "datasheet" and after[0]["probe_failures"] is None

    out = cli(daemon)
    assert out.exit_code == 0, out.output
    rows = out.output.splitlines()
    assert rows[0].split()[:4] == ["AT", "PROVIDER", "INSTANCE", "TYPE"]
    assert len(rows) == 5
    assert "sick" in rows[2] and " fail " in rows[2] and "20.0 TFLOPS" in rows[2]
    assert rows[1].endswith("(host GPU)") and not rows[3].endswith(")")
    only = json.loads(cli(daemon, "--instance-type", "p4de.24xlarge", "--json").output)
    assert [(p["job"], p["status"]) for p in only] == [("sick", "fail")]
    limited = json.loads(cli(daemon, "--limit", "1", "--json").output)
    assert [p["job"] for p in limited] == ["host"]

    shown = CliRunner().invoke(
        app,
        ["offers", "--policy", "perflop", "--api", daemon.url],
        env={"GPUOPT_API_TOKEN": TOKEN, "COLUMNS": "250"},
    )
    assert shown.exit_code == 0, shown.output
    assert "measured (n=2, 0.0 h old)" in shown.output and "datasheet" in shown.output
