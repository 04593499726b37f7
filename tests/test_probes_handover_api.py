"""The daemon's choice of probe for an attempt, through the real register route: a `quick`
job's first boot of a type runs the quick probe, a later boot of that type the handover probe;
`deep` and `none` stay as the spec says, and `job.probes` keeps the spec's value."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from optimizer.clock import ManualClock
from optimizer.daemon.service import Daemon
from optimizer.store.jobs import token_sha256
from tests.helpers import make_offer
from tests.helpers.daemon import make_config, running
from tests.helpers.offers import T0
from tests.helpers.probes import probe_json

pytestmark = pytest.mark.usefixtures("daemon_env")


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    with running(make_config(tmp_path), clock=ManualClock(T0)) as d:
        yield d


def attempt(daemon: Daemon, job: int, number: int, **offer: Any) -> tuple[str, str]:
    """An attempt of `job` on an offer (aws p5.48xlarge unless told), under a policy the
    daemon has not loaded, so the reconcile loop leaves it alone."""
    key, token = f"{job}-{number}", f"token-{job}-{number}"
    place = make_offer(provider=offer.pop("provider", "aws"), **offer)
    daemon.store.jobs.create_attempt(job, number, key, place, token_sha256(token), T0)
    return key, token


def post(daemon: Daemon, node: tuple[str, str], path: str, **body: Any) -> dict[str, Any]:
    key, token = node
    with httpx.Client(base_url=daemon.url, timeout=30) as client:
        response = client.post(
            f"/agent/v1/{path}",
            json={"attempt_key": key, **body},
            headers={"Authorization": f"Bearer {token}"},
        )
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def probe_of(daemon: Daemon, node: tuple[str, str]) -> tuple[str, str]:
    """(what the attempt runs, the spec's `probes` as the answer's job carries it)."""
    answer = post(daemon, node, "register", instance_id=f"i-{node[0]}")
    return answer["probe"], answer["job"]["probes"]


def reported(daemon: Daemon, node: tuple[str, str], status: str, result: dict[str, Any]) -> None:
    event = {"id": f"probe-{node[0]}", "kind": "probe_result", "data": {"status": status}}
    event["data"]["result"] = result
    post(daemon, node, "events", events=[event])


def test_a_types_first_boot_runs_quick_and_later_boots_the_handover(daemon: Daemon) -> None:
    quick = daemon.store.jobs.add_job("q", "p", {"run": "x", "probes": "quick"}, at=T0)
    first = attempt(daemon, quick, 1, instance_type="p5.48xlarge")
    assert probe_of(daemon, first) == ("quick", "quick")
    reported(daemon, first, "fail", probe_json(650.0))
    failed_once = attempt(daemon, quick, 2, instance_type="p5.48xlarge")
    assert probe_of(daemon, failed_once) == ("quick", "quick")  # a failed result is no proof
    reported(daemon, failed_once, "pass", probe_json(650.0))
    later = attempt(daemon, quick, 3, instance_type="p5.48xlarge")
    assert probe_of(daemon, later) == ("handover", "quick")
    # Another type, or the same type on another provider, is a first boot again.
    assert probe_of(daemon, attempt(daemon, quick, 4, instance_type="p4d.24xlarge"))[0] == "quick"
    gcp = attempt(daemon, quick, 5, provider="gcp", instance_type="p5.48xlarge")
    assert probe_of(daemon, gcp)[0] == "quick"
    # `deep` and `none` are run as written, on a type already probed.
    for spec in ("deep", "none"):
        job = daemon.store.jobs.add_job(spec, "p", {"run": "x", "probes": spec}, at=T0)
        assert probe_of(daemon, attempt(daemon, job, 1, instance_type="p5.48xlarge")) == (
            spec,
            spec,
        )


def test_without_a_gpu_only_the_local_clouds_types_count_as_probed(daemon: Daemon) -> None:
    quick = daemon.store.jobs.add_job("q", "p", {"run": "x", "probes": "quick"}, at=T0)
    cpu_only = probe_json(0.4, backend="cpu", gpus=1)
    for number, provider in enumerate(("aws", "local"), start=1):
        first = attempt(daemon, quick, number, provider=provider, instance_type="g5.xlarge")
        assert probe_of(daemon, first)[0] == "quick"
        reported(daemon, first, "warn", cpu_only)
    # The local cloud's instances are all this host: its CPU result is that type's.
    local = attempt(daemon, quick, 3, provider="local", instance_type="g5.xlarge")
    assert probe_of(daemon, local)[0] == "handover"
    aws = attempt(daemon, quick, 4, provider="aws", instance_type="g5.xlarge")
    assert probe_of(daemon, aws)[0] == "quick"
