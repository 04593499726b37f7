"""Owned machines: the launch over SSH beside the local cloud's, and a scheduling pass over 200
owned machines.

1. **Notice -> replacement running.** A real daemon (in this process) with two owned machines,
   each a real sshd on loopback (real keys, host keys checked, one simulated T4 apiece), runs
   one job under a policy that allows only them. Each round takes the job's machine back
   (`drain`, a 30 s notice): the hot handover launches the replacement on the other machine
   over SSH (folder, bootstrap, agent started in its own session), which registers, restores
   the checkpoint and starts the job; then the machine is given back. The same job on the local
   cloud, interrupted with the same notice, is the reference: the difference is what SSH costs.
   Measured from the daemon's store: the old attempt's `notice_at` -> the new attempt's
   `job_started_at` (the agents' own report times), and the launch call's own seconds.
2. **A scheduling pass with 200 owned machines.** The provider's offers (`fetch_offers`, which
   reads its state: 200 machines, their checks and ~400 live instances) and the policy engine
   ranking them beside the local cloud's offers (`policies.engine.evaluate`), timed over runs.

Writes bench/results/owned.json.

    python bench/owned.py [--rounds 3] [--runs 20]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if not __package__:
    os.chdir(ROOT)
    os.execv(sys.executable, [sys.executable, "-m", "bench.owned", *sys.argv[1:]])

from optimizer.daemon.service import Daemon  # noqa: E402
from policies.engine import evaluate  # noqa: E402
from policies.schema import Policy  # noqa: E402
from providers.base import ProviderSettings  # noqa: E402
from providers.local import LocalCloud  # noqa: E402
from providers.ssh import SshConfig  # noqa: E402
from providers.ssh import build as build_owned  # noqa: E402
from providers.ssh.inventory import Check, Instance, StateFile  # noqa: E402
from tests.helpers.cloud import local_cloud  # noqa: E402
from tests.helpers.code import ship  # noqa: E402
from tests.helpers.daemon import api, make_config, running  # noqa: E402
from tests.helpers.jobs import job_body  # noqa: E402
from tests.helpers.policies import write_policy  # noqa: E402
from tests.helpers.sshd import make_key, sshd  # noqa: E402
from tests.helpers.waiting import wait_until  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "owned.json"
POLICY = """\
apiVersion: gpuopt/v1
kind: Policy
name: bench-owned
workload: {{gpus: 1, gpu_memory_gib: 12}}
markets: [{markets}]
placement: {{providers: [{provider}], compliance: eu}}
recovery: {{max_restarts: 50, pool_cooldown_minutes: 0, on_demand_after_interruptions: 100}}
"""
TCO = {"capex_usd": 2000.0, "life_years": 3.0, "power_kw": 0.2}
NOTICE_S = 30.0


def _python() -> str:
    path = os.environ.get("PYTHONPATH")
    return f"env PYTHONPATH={path} {sys.executable}" if path else sys.executable


def _clean_env() -> None:
    for name in list(os.environ):
        if name.startswith("GPUOPT_") and name != "GPUOPT_SHARED_DIR":
            del os.environ[name]


def _running(daemon: Daemon, job_id: int, after: int = 0) -> Any:
    return next(
        (
            a
            for a in daemon.store.jobs.attempts(job_id)
            if a.number > after and a.job_started_at is not None and not a.ended
        ),
        None,
    )


def _round(daemon: Daemon, job_id: int, current: Any) -> dict[str, Any]:
    new = wait_until(lambda: _running(daemon, job_id, current.number), 300, "the replacement")
    old = daemon.store.jobs.attempt(current.key) or current
    assert old.notice_at is not None and new.job_started_at is not None
    return {
        "notice_to_replacement_started_s": round(
            new.job_started_at.timestamp() - old.notice_at.timestamp(), 3
        ),
        "notice_to_launched_s": round(new.started_at.timestamp() - old.notice_at.timestamp(), 3),
        "where": new.instance_id,
    }


def owned_rounds(folder: Path, rounds: int) -> list[dict[str, Any]]:
    _clean_env()
    key = make_key(folder / "keys")
    pub = key.with_suffix(".pub")
    out: list[dict[str, Any]] = []
    with (
        sshd(folder / "sshd-a", "own-a", authorized=[pub]) as a,
        sshd(folder / "sshd-b", "own-b", authorized=[pub]) as b,
    ):
        known = folder / "known_hosts"
        known.write_text(a.known_hosts_line() + "\n" + b.known_hosts_line() + "\n")
        owned_config = {
            "known_hosts": str(known),
            "machines": [
                {
                    "name": m.name,
                    "host": "127.0.0.1",
                    "user": m.target(key).user,
                    "port": m.port,
                    "key_file": str(key),
                    "region": "eu-central-1",
                    "gpus": 1,
                    "gpu_model": "T4",
                    "python": _python(),
                    "work_dir": str(folder / "work" / m.name),
                    "simulate_gpus": True,
                    "tco": TCO,
                }
                for m in (a, b)
            ],
        }
        write_policy(
            folder / "policies",
            "bench-owned.yaml",
            POLICY.format(markets="owned", provider="ssh"),
        )
        env = {"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {}
        config = make_config(
            folder / "daemon",
            policy_dir=folder / "policies",
            providers={"ssh": owned_config},
            loops={"reconcile_s": 0.25},
            agent={"install": {"venv": sys.prefix, "prebaked": True}, "env": env},
        )
        settings = ProviderSettings(
            config=SshConfig.model_validate(owned_config), data_dir=folder / "daemon"
        )
        owned = build_owned(settings)
        with (
            local_cloud(folder / "cloud", grace_s=30, terminate_grace_s=2.0, tick_s=0.05) as cloud,
            running(config, sources={"local": cloud, "ssh": owned}) as daemon,
            api(daemon) as client,
        ):
            for poll in daemon.polls:
                poll.run_once()
            ship(daemon)
            body = job_body("bench", folder / "ckpt", steps=10_000_000, policy="bench-owned")
            assert client.post("/jobs", json=body).status_code == 201
            job_id = int(client.get("/jobs/bench").json()["id"])
            for n in range(rounds):
                current = wait_until(lambda: _running(daemon, job_id), 300, "the job running")
                time.sleep(2.0)  # let it make steps before the notice
                machine = current.instance_id.rsplit("-", 1)[0]
                drained = client.post(f"/machines/{machine}/drain", json={"in_s": NOTICE_S})
                assert drained.status_code == 200, drained.text
                row = {"mode": "owned", "round": n + 1, **_round(daemon, job_id, current)}
                out.append(row)
                print(json.dumps(row), flush=True)
                wait_until(
                    lambda c=current: (daemon.store.jobs.attempt(c.key) or c).ended,
                    120,
                    "the old attempt ended",
                )
                assert client.post(f"/machines/{machine}/undrain").status_code == 200
            client.post("/jobs/bench/cancel")
    return out


def local_rounds(folder: Path, rounds: int) -> list[dict[str, Any]]:
    _clean_env()
    write_policy(
        folder / "policies", "bench-owned.yaml", POLICY.format(markets="spot", provider="local")
    )
    config = make_config(folder, policy_dir=folder / "policies", loops={"reconcile_s": 0.25})
    out: list[dict[str, Any]] = []
    with (
        local_cloud(
            folder / "cloud", grace_s=NOTICE_S, terminate_grace_s=2.0, tick_s=0.05
        ) as cloud,
        running(config, sources={"local": cloud}) as daemon,
        api(daemon) as client,
    ):
        for poll in daemon.polls:
            poll.run_once()
        ship(daemon)
        body = job_body("bench", folder / "ckpt", steps=10_000_000, policy="bench-owned")
        assert client.post("/jobs", json=body).status_code == 201
        job_id = int(client.get("/jobs/bench").json()["id"])
        for n in range(rounds):
            current = wait_until(lambda: _running(daemon, job_id), 300, "the job running")
            time.sleep(2.0)
            cloud.interrupt(current.instance_id or "")
            row = {"mode": "local", "round": n + 1, **_round(daemon, job_id, current)}
            out.append(row)
            print(json.dumps(row), flush=True)
        client.post("/jobs/bench/cancel")
    return out


def scheduling_pass(folder: Path, machines: int, runs: int) -> dict[str, Any]:
    """fetch_offers over `machines` owned machines, then the ranking beside the local cloud's
    offers; seconds per run (median, max)."""
    rng = random.Random(7)
    models = [("T4", 16, 4), ("A10G", 24, 4), ("L4", 24, 8), ("H100-80GB", 80, 8)]
    sites = ["fra-a", "fra-b", "dub-a", "ams-a"]
    regions_of = {"fra-a": "eu-central-1", "fra-b": "eu-central-1", "dub-a": "eu-west-1"}
    specs = []
    for n in range(machines):
        model, memory, gpus = models[n % len(models)]
        site = sites[n % len(sites)]
        specs.append(
            {
                "name": f"m{n:03d}",
                "host": f"10.0.{n // 250}.{n % 250 + 1}",
                "user": "gpuopt",
                "region": regions_of.get(site, "eu-north-1"),
                "site": site,
                "gpus": gpus,
                "gpu_model": model,
                "gpu_memory_gib": memory,
                "tco": {**TCO, "capex_usd": 4000.0 * gpus * (1 + n % 3)},
            }
        )
    config = SshConfig.model_validate({"machines": specs})
    owned = build_owned(ProviderSettings(config=config, data_dir=folder))
    now = time.time()
    state = StateFile(folder / "ssh" / "state.json")
    with state.edit() as edit:
        for spec in config.machines:
            edit.checks[spec.name] = Check(now + 3600, True, "bench")  # no check falls due
            taken = rng.randint(0, spec.gpus)
            for g in range(taken):
                iid = f"{spec.name}-{edit.next_id:04d}"
                edit.next_id += 1
                edit.instances[iid] = Instance(
                    iid, iid, spec.name, [g], "bench", 1, f"owned-1x{spec.gpu_model}", 0.1, now
                )
    policy = Policy.model_validate(
        {
            "apiVersion": "gpuopt/v1",
            "kind": "Policy",
            "name": "bench-owned",
            "workload": {"gpus": 1, "gpu_memory_gib": 12},
            "markets": ["owned", "spot", "on_demand"],
            "placement": {"providers": ["ssh", "local"], "compliance": "eu"},
        }
    )
    cloud = LocalCloud(folder / "cloud")
    cloud_offers = cloud.fetch_offers()
    cloud.close()
    fetch, rank = [], []
    offers: list[Any] = []
    for _ in range(runs):
        t0 = time.perf_counter()
        offers = owned.fetch_offers()
        t1 = time.perf_counter()
        ranking = evaluate(policy, [*offers, *cloud_offers], datetime.now(UTC))
        t2 = time.perf_counter()
        fetch.append(t1 - t0)
        rank.append(t2 - t1)
    top = ranking.candidates[0].offer if ranking.candidates else None
    return {
        "machines": machines,
        "live_instances": sum(1 for _ in StateFile(folder / "ssh" / "state.json").read().live()),
        "owned_offers": len(offers),
        "cloud_offers": len(cloud_offers),
        "fetch_offers_s": {"median": statistics.median(fetch), "max": max(fetch)},
        "rank_s": {"median": statistics.median(rank), "max": max(rank)},
        "top": None if top is None else f"{top.provider} {top.instance_type} {top.zone}",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--machines", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpuopt-bench-owned-") as tmp:
        scheduling = scheduling_pass(Path(tmp) / "pass", args.machines, args.runs)
    print(json.dumps(scheduling), flush=True)
    rounds: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="gpuopt-bench-owned-") as tmp:
        rounds += owned_rounds(Path(tmp), args.rounds)
    with tempfile.TemporaryDirectory(prefix="gpuopt-bench-owned-") as tmp:
        rounds += local_rounds(Path(tmp), args.rounds)

    def median(mode: str, key: str) -> float:
        return statistics.median(r[key] for r in rounds if r["mode"] == mode)

    result = {
        "bench": "owned",
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "load_average_1m": os.getloadavg()[0],
        "notice_s": NOTICE_S,
        "rounds": rounds,
        "median": {
            mode: {
                "notice_to_replacement_started_s": median(mode, "notice_to_replacement_started_s"),
                "notice_to_launched_s": median(mode, "notice_to_launched_s"),
            }
            for mode in ("owned", "local")
        },
        "scheduling_pass": scheduling,
        "command": "python bench/owned.py " + " ".join(sys.argv[1:]),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["median"], indent=2))
    print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
