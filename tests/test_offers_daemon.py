"""`gpuopt offers --policy` asks the daemon what it would pick, as users run it: a real
`gpuopt daemon` on loopback with the local cloud, and each CLI command as a process. Without
a daemon the policy is ranked here, with a one-line note; `--provider local` reads the local
cloud's simulated offers; an unknown provider is refused."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from optimizer.store import Store
from providers import registry
from providers.local import LocalCloud
from tests.helpers import DaemonProcess, make_offer, run_gpuopt, wait_until

pytestmark = pytest.mark.usefixtures("daemon_env")
ROOT = Path(__file__).resolve().parents[1]
POLICY = ROOT / "examples" / "local-train-policy.yaml"  # name: local-train, providers: [local]
JOB = """\
name: probe-free
policy: local-train
run: sleep 120
checkpoint_dir: {ckpt}
probes: none
"""


@pytest.fixture
def data(tmp_path: Path) -> Iterator[Path]:
    data = tmp_path / "data"
    (data / "policies").mkdir(parents=True)
    shutil.copy(POLICY, data / "policies" / POLICY.name)
    yield data
    LocalCloud(data / "local-cloud").kill_all()  # the instances this test's daemon started


@pytest.fixture
def daemon(data: Path) -> Iterator[DaemonProcess]:
    process = DaemonProcess(data)
    try:
        wait_until(process.healthy, 60, "the daemon to serve")
        yield process
    finally:
        process.stop()


def gpuopt(data: Path, *args: str, api: str) -> subprocess.CompletedProcess[str]:
    """`gpuopt <args>` as in a second terminal: the data directory (and the token the daemon
    wrote there) and GPUOPT_API_URL."""
    return run_gpuopt(data, *args, env={"GPUOPT_API_URL": api, "COLUMNS": "250"})


def ranked(data: Path, api: str, *args: str) -> dict[str, Any]:
    done = gpuopt(data, "offers", "--policy", str(POLICY), "--json", *args, api=api)
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def pool(offer: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(offer[k] for k in ("provider", "region", "zone", "instance_type", "market"))


def test_the_daemon_ranks_its_live_offers_as_its_next_launch_walks_them(
    data: Path, daemon: DaemonProcess
) -> None:
    table = gpuopt(data, "offers", "--policy", str(POLICY), "--explain", api=daemon.url)
    assert table.returncode == 0 and table.stderr == "", table.stderr
    assert f"(source: daemon at {daemon.url}: live offers, ranked as a launch would)" in (
        " ".join(table.stdout.split())  # the title may wrap
    )
    assert "run with --explain" not in table.stdout
    assert "rejected offers, by the first rule they failed" in table.stdout

    before = ranked(data, daemon.url, "--limit", "3")
    assert before["source"].startswith(f"daemon at {daemon.url}")
    assert before["candidate_count"] > 3 and before["cooling_down"] == 0
    assert [c["rank"] for c in before["candidates"]] == [1, 2, 3]
    assert {c["offer"]["provider"] for c in before["candidates"]} == {"local"}
    best = before["candidates"][0]["offer"]

    # The best pool refuses the next launch: the daemon cools it and launches on the next.
    where = best["zone"] or best["region"]
    assert gpuopt(data, "local", "fail-next", where, api=daemon.url).returncode == 0
    spec = data.parent / "job.yaml"
    spec.write_text(JOB.format(ckpt=data.parent / "ckpt"))
    submitted = gpuopt(data, "jobs", "submit", str(spec), api=daemon.url)
    assert submitted.returncode == 0, submitted.stderr
    with Store(f"sqlite:///{data / 'gpuopt.db'}") as store:
        job = store.jobs.get_job("probe-free")
        assert job is not None
        first, second = wait_until(
            lambda: (a := store.jobs.attempts(job.id))[1:] and a, 30, "the second launch"
        )
    assert (first.pool, first.end_reason) == (pool(best), "capacity")

    # What `offers --policy` shows now is where that launch went: the cooled pool sits out.
    after = ranked(data, daemon.url, "--limit", "0")
    assert after["cooling_down"] == 1
    assert pool(after["candidates"][0]["offer"]) == second.pool
    assert pool(best) not in {pool(c["offer"]) for c in after["candidates"]}
    assert gpuopt(data, "jobs", "cancel", "probe-free", api=daemon.url).returncode == 0


def test_filters_and_a_policy_name_go_to_the_daemon_too(data: Path, daemon: DaemonProcess) -> None:
    whole = ranked(data, daemon.url, "--limit", "0")
    args = ("--region", "eu-central-*", "--market", "spot", "--limit", "0")
    by_name = gpuopt(data, "offers", "--policy", "local-train", "--json", *args, api=daemon.url)
    assert by_name.returncode == 0, by_name.stderr
    chosen = json.loads(by_name.stdout)
    expected = [
        c
        for c in whole["candidates"]
        if c["offer"]["region"].startswith("eu-central-") and c["offer"]["market"] == "spot"
    ]
    # The daemon's ranks, filtered here: rank numbers stay the daemon's.
    assert [(c["rank"], pool(c["offer"])) for c in chosen["candidates"]] == [
        (c["rank"], pool(c["offer"])) for c in expected
    ]
    assert expected and chosen["candidate_count"] == len(expected)


def test_an_edited_policy_file_is_ranked_by_the_daemon_under_the_version_it_loaded(
    data: Path, daemon: DaemonProcess, tmp_path: Path
) -> None:
    edited = tmp_path / "local-train.yaml"
    edited.write_text(POLICY.read_text().replace("monthly_usd: 500", "monthly_usd: 400"))
    done = gpuopt(data, "offers", "--policy", str(edited), "--json", api=daemon.url)
    assert done.returncode == 0, done.stderr
    assert done.stderr == (
        f"gpuopt: the daemon's policy 'local-train' is not the content of {edited}; "
        "showing the daemon's ranking, under the version it loaded\n"
    )
    assert json.loads(done.stdout)["source"].startswith("daemon at")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_without_a_daemon_the_file_is_ranked_here_with_a_note(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "api-token").write_text("a-token-no-daemon-holds")
    nobody = f"http://127.0.0.1:{free_port()}"
    args = ("offers", "--policy", str(POLICY), "--explain")
    here = gpuopt(data, *args, api=nobody)
    assert here.returncode == 0, here.stderr
    assert here.stderr == (
        f"gpuopt: {POLICY} ranked here (source: local, snapshot), not by the daemon: cannot "
        f"reach the daemon at {nobody}: connection refused (is it running?)\n"
    )
    # The policy names the local cloud: its own offers are ranked (computed here, as the
    # daemon's local cloud lists them) beside the snapshot's clouds, which it rejects.
    ranked = gpuopt(data, *args, "--json", api=nobody)
    answer = json.loads(ranked.stdout)
    assert answer["candidate_count"] > 0
    assert {c["offer"]["provider"] for c in answer["candidates"]} == {"local"}
    # At a given time, the local cloud's prices are those of that time, the same each run.
    at = ("--at", "2026-03-02T10:00:00Z")
    first, again = (json.loads(gpuopt(data, *args, "--json", *at, api=nobody).stdout) for _ in "ab")
    assert first["candidates"] == again["candidates"]
    assert {c["offer"]["observed_at"] for c in first["candidates"]} == {"2026-03-02T10:00:00Z"}
    assert not (data / "local-cloud").exists()  # reading its offers creates nothing

    local = gpuopt(data, *args, "--provider", "local", "--json", api=nobody)
    assert local.returncode == 0, local.stderr
    answer = json.loads(local.stdout)
    assert answer["source"] == "local" and answer["candidate_count"] > 0
    spot = [c["offer"] for c in answer["candidates"] if c["offer"]["market"] == "spot"]
    assert spot and {o["source"] for o in spot} == {"simulated"}
    assert not (data / "local-cloud").exists()  # reading its offers creates nothing


def test_provider_local_lists_the_local_clouds_simulated_offers(tmp_path: Path) -> None:
    listed = run_gpuopt(tmp_path, "offers", "--provider", "local", "--json", "--limit", "0")
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert rows and {r["provider"] for r in rows} == {"local"}
    spot = [r for r in rows if r["market"] == "spot"]
    assert spot and {r["source"] for r in spot} == {"simulated"}
    assert len(rows) == 3 * len([r for r in rows if r["market"] == "on_demand"])


def test_an_unknown_provider_is_refused_with_the_known_ones(tmp_path: Path) -> None:
    done = run_gpuopt(tmp_path, "offers", "--provider", "azure")
    assert (done.returncode, done.stdout) == (2, "")
    known = ", ".join(registry.names())  # the installed providers
    assert done.stderr == f"gpuopt: error: --provider: unknown provider 'azure'; known: {known}\n"


def test_the_daemon_ranks_at_an_instant_and_shows_each_candidates_expected_cost(
    data: Path, daemon: DaemonProcess
) -> None:
    answer = ranked(data, daemon.url, "--limit", "0", "--at", "2026-12-01T10:00:00+01:00")
    assert answer["at"] == "2026-12-01T09:00:00Z" and answer["window"] is None  # no schedule
    candidates = answer["candidates"]
    assert candidates and all(c["expected_usd_per_hour"] is not None for c in candidates)
    for c in candidates:
        spot = c["offer"]["market"] == "spot"
        # no attempts yet: a spot pool's p is the default prior, the overhead the default
        assert (c["interruption_p"], c["interruption_source"]) == (
            (0.01, "prior (default)") if spot else (0.0, "on-demand")
        )
        assert c["expected_usd_per_hour"] == pytest.approx(
            c["offer"]["usd_per_hour"] * (1 + c["interruption_p"] * 0.25)
        )


def test_offers_for_a_job_rank_with_what_moving_its_checkpoint_costs(
    data: Path, daemon: DaemonProcess
) -> None:
    """`gpuopt offers --job NAME` ranks as that job's next launch: its policy, and each
    offer's move of the job's newest checkpoint (egress plus the restore's time)."""
    from tests.helpers.offers import T0  # a fixed instant: no figure here reads the time

    spec = {"run": "x", "checkpoint": {"uri": "s3://team/r", "keep": 3, "region": "us-east-1"}}
    with Store(f"sqlite:///{data / 'gpuopt.db'}") as store:
        job = store.jobs.add_job("moving", "local-train", spec)
        # Ended at once, so the running daemon never launches it; its checkpoint stays.
        assert store.jobs.transition_job(
            job, expected="pending", state="cancelled", reason="test", at=T0
        )
        attempt = store.jobs.create_attempt(
            job, 1, "moving-1", make_offer(provider="aws"), "0" * 64, T0
        ).id
        store.checkpoints.add_checkpoint(
            job_id=job, attempt_id=attempt, name="step-9", step=9, size_bytes=50 * 10**9,
            files=1, uri="s3://team/r/data/step-9", provider="aws", region="us-east-1",
            committed_at=T0, upload_s=9.0, final=True,
        )  # fmt: skip
    done = gpuopt(data, "offers", "--job", "moving", "--json", "--limit", "0", api=daemon.url)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["policy"] == "local-train" and answer["candidates"]
    for candidate in answer["candidates"]:
        # out of AWS to another cloud (the local one): $0.09/GB, and the restore's time
        assert candidate["move"].startswith("moving 46.6 GiB from aws us-east-1: $4.50 egress")
        assert candidate["move_usd"] > 4.5
    table = gpuopt(data, "offers", "--job", "moving", api=daemon.url)
    assert table.returncode == 0, table.stderr
    assert "ranked as job moving's next launch" in " ".join(table.stdout.split())
    assert "move $/h" in table.stdout
    unknown = gpuopt(data, "offers", "--job", "nobody", api=daemon.url)
    assert unknown.returncode == 2 and "--job nobody: no job named 'nobody'" in unknown.stderr
    other = gpuopt(data, "offers", "--job", "moving", "--policy", "other", api=daemon.url)
    assert other.returncode == 2
    assert "job moving runs under policy local-train, not other" in other.stderr


def test_offers_lists_what_the_daemon_polls_with_simulated_prices_marked(
    data: Path, daemon: DaemonProcess
) -> None:
    """Without --provider or --catalog, `gpuopt offers` lists the daemon's latest offers (here
    the local cloud's, which the snapshot does not hold); simulated prices are marked."""
    table = gpuopt(data, "offers", "--market", "spot", "--limit", "5", api=daemon.url)
    assert table.returncode == 0 and table.stderr == "", table.stderr
    text = " ".join(table.stdout.split())
    assert f"(source: daemon at {daemon.url}: local)" in text
    rows = [line for line in table.stdout.splitlines() if "│ local" in line]
    assert len(rows) == 5 and all(" sim " in row for row in rows)
    assert "sim: a simulated price (the local cloud's), not a quote" in text
    listed = gpuopt(data, "offers", "--json", "--limit", "0", api=daemon.url)
    offers = json.loads(listed.stdout)
    assert {o["provider"] for o in offers} == {"local"} and len(offers) > 1000  # past a page
    assert offers == sorted(offers, key=lambda o: o["usd_per_hour"])


def test_without_a_daemon_offers_shows_the_snapshot_and_says_so(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "api-token").write_text("a-token-no-daemon-holds")
    nobody = f"http://127.0.0.1:{free_port()}"
    listed = gpuopt(data, "offers", "--limit", "2", api=nobody)
    assert listed.returncode == 0, listed.stderr
    assert listed.stderr.startswith("gpuopt: no daemon (cannot reach the daemon at ")
    assert listed.stderr.rstrip().endswith("showing the bundled snapshot")
    assert "(source: snapshot)" in " ".join(listed.stdout.split())
