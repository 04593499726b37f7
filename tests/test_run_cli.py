"""`gpuopt run` and the plan before the launch, as users run them: a real `gpuopt daemon` on
loopback with the local cloud, and each CLI command as a process (a pseudo-terminal where a
person would answer "Launch? [Y/n]").

The jobs that are submitted bid far under every local offer, so they wait `pending` and no
instance is started; the daemon's pass still runs them under their own policy (its reason
names it)."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from providers.local import LocalCloud
from tests.helpers import DaemonProcess, run_gpuopt, wait_until
from tests.helpers.daemon import start_gpuopt

pytestmark = pytest.mark.usefixtures("daemon_env")

CHEAP = ("--max-price", "0.0001")  # under every local offer: the job waits, launching nothing


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    data = tmp_path_factory.mktemp("run") / "data"
    process = DaemonProcess(data)
    try:
        wait_until(process.healthy, 60, "the daemon to serve")
        yield process
    finally:
        process.stop()
        LocalCloud(data / "local-cloud").kill_all()  # none is expected; never leave one


def gpuopt(daemon: DaemonProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return run_gpuopt(daemon.data_dir, *args, env=_env(daemon))


def _env(daemon: DaemonProcess) -> dict[str, str]:
    return {"GPUOPT_API_URL": daemon.url, "COLUMNS": "200"}


def shown(daemon: DaemonProcess, name: str) -> dict[str, object] | None:
    found = gpuopt(daemon, "jobs", "show", name, "--json")
    if found.returncode != 0:
        assert "404" in found.stderr, found.stderr
        return None
    answer: dict[str, object] = json.loads(found.stdout)
    return answer


def test_dry_run_prints_the_ranked_plan_and_submits_nothing(daemon: DaemonProcess) -> None:
    done = gpuopt(
        daemon, "run", "--gpu", "T4", "--spot", "--name", "dry", "--dry-run", "--", "echo", "hi"
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert out.startswith("plan for job dry: policy job-dry (inline resources over default)\n")
    assert "  runs on: 1 GPU (T4); markets spot\n" in out
    header = next(line for line in out.splitlines() if line.startswith("#"))
    assert header.split() == ["#", "WHERE", "MARKET", "$/H", "EXP", "$/H", "GPUS", "TYPE"]
    rows = [line.split() for line in out.splitlines() if line[:2] in {"1 ", "2 ", "3 "}]
    assert len(rows) == 3 and all(r[1].startswith("local/") for r in rows)
    assert all(r[2] == "spot" and r[5] == "1xT4" for r in rows)
    prices = [float(r[3].lstrip("$")) for r in rows]
    assert prices == sorted(prices)
    # Every rule that rejected offers, with its count; the other markets and GPUs are out.
    rejected = next(line for line in out.splitlines() if line.startswith("rejected: "))
    assert "market " in rejected and "gpu_model " in rejected
    assert (
        "note: no checkpoint or checkpoint_dir: after an interruption the job restarts "
        "from the beginning" in out
    )
    assert out.endswith("dry run: nothing submitted\n")
    assert shown(daemon, "dry") is None


def test_yes_submits_and_the_job_runs_under_its_effective_policy(daemon: DaemonProcess) -> None:
    done = gpuopt(
        daemon, "run", "-y", "--gpu", "T4", *CHEAP, "--region", "eu-*", "--name", "yes",
        "--", "python", "train.py", "--epochs", "3",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("yes: pending (policy job-yes, restarts 0)\n")
    assert "plan for job yes" in done.stderr and "Launch?" not in done.stderr + done.stdout
    job = shown(daemon, "yes")
    assert job is not None
    spec, doc = job["spec"], job["effective_policy"]
    assert isinstance(spec, dict) and isinstance(doc, dict)
    assert spec["run"] == "python train.py --epochs 3"
    assert spec["resources"] == {"gpu": "T4", "max_price": 0.0001, "regions": ["eu-*"]}
    assert doc["workload"]["gpu_models"] == ["T4"]  # type: ignore[index]
    assert doc["bid"]["max_usd_per_hour"] == 0.0001  # type: ignore[index]
    assert doc["placement"]["regions"]["allow"] == ["eu-*"]  # type: ignore[index]
    assert doc["markets"] == ["spot", "on_demand"]  # the shipped default's
    # The daemon's pass found the job's own policy and ranked under it: no offer is cheap enough.
    wait_until(
        lambda: "no offer meets policy job-yes" in str((shown(daemon, "yes") or {})["reason"]),
        60,
        "the job's pass",
    )
    text = gpuopt(daemon, "jobs", "show", "yes")
    assert "  effective policy job-yes (inline resources over policy default):\n" in text.stdout
    assert "    bid: $0.0001/h; no budget\n" in text.stdout


def test_a_non_terminal_is_not_asked_and_submits(daemon: DaemonProcess, tmp_path: Path) -> None:
    spec = tmp_path / "hi.yaml"
    spec.write_text("name: piped\nrun: echo hi\nresources: {gpu: T4, max_price: 0.0001}\n")
    done = gpuopt(daemon, "jobs", "submit", str(spec))
    assert done.returncode == 0, done.stderr
    assert done.stdout == "piped: pending (policy job-piped, restarts 0)\n"
    assert done.stderr.startswith("plan for job piped: policy job-piped")
    assert "Launch?" not in done.stderr
    assert shown(daemon, "piped") is not None


def test_a_bad_inline_value_is_located_at_its_flag_or_line(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    flag = gpuopt(daemon, "run", "--gpu", "T5", "--region", "mars-*", "--", "echo", "hi")
    assert flag.returncode == 2
    lines = flag.stderr.splitlines()
    assert lines[0].startswith("gpuopt: error: --gpu: unknown GPU model 'T5'; known models: T4")
    assert lines[1] == (
        "gpuopt: error: --region: 'mars-*' matches no region gpuopt knows (AWS and GCP "
        "regions, e.g. eu-west-1, europe-west4)"
    )
    spec = tmp_path / "bad.yaml"
    spec.write_text("name: bad\nrun: echo hi\nresources:\n  compliance: mars\n")
    located = gpuopt(daemon, "jobs", "submit", str(spec), "--dry-run")
    assert located.returncode == 2
    assert located.stderr.startswith(f"{spec}:4:15: resources.compliance: unknown compliance")
    named = gpuopt(daemon, "run", "--name", "Bad_Name", "--", "echo", "hi")
    assert named.returncode == 2
    assert named.stderr.startswith("gpuopt: error: --name 'Bad_Name': a job name is 1-63")
    assert flag.stdout == located.stdout == named.stdout == ""


def test_the_plan_gives_the_cost_to_finish_from_the_specs_work(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    spec = tmp_path / "work.yaml"
    spec.write_text(
        "name: work\nrun: python train.py\ncheckpoint_dir: /tmp/c\nwork: 10h\n"
        "deadline: 48h\nresources: {gpu: T4, market: spot}\n"
    )
    done = gpuopt(daemon, "jobs", "submit", str(spec), "--dry-run", "--json")
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["work_hours"] == 10 and plan["restarts_from_beginning"] is False
    assert plan["notes"] == [] and len(plan["candidates"]) == 5
    for c in plan["candidates"]:
        assert c["expected_usd_to_finish"] == round(10 * c["expected_usd_per_hour"], 2)
    text = gpuopt(daemon, "jobs", "submit", str(spec), "--dry-run")
    rows = [line.split() for line in text.stdout.splitlines() if line[:2] == "1 "]
    header = next(line for line in text.stdout.splitlines() if line.startswith("#"))
    assert header.split()[5:8] == ["$/H", "TO", "FINISH"]
    assert rows[0][5] == f"${plan['candidates'][0]['expected_usd_to_finish']:,.2f}"
    assert "cost to finish: unknown" not in text.stdout
    assert "restarts from the beginning" not in text.stdout


def _on_a_terminal(daemon: DaemonProcess, answer: bytes, *args: str) -> tuple[int, str]:
    """`gpuopt <args>` with a pseudo-terminal as its stdin and stdout, `answer` typed."""
    master, slave = pty.openpty()
    proc = start_gpuopt(
        daemon.data_dir, *args, env=_env(daemon), stdin=slave, stdout=slave, stderr=slave
    )
    os.close(slave)
    os.write(master, answer)
    seen = bytearray()

    def drained() -> bool:
        ready, _, _ = select.select([master], [], [], 0.05)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the other end closed: the process ended
                chunk = b""
            seen.extend(chunk)
            return not chunk and proc.poll() is not None
        return proc.poll() is not None

    try:
        wait_until(drained, 60, "gpuopt on a terminal")
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        os.close(master)
    return proc.returncode, seen.decode(errors="replace").replace("\r\n", "\n")


def test_a_terminal_is_asked_and_no_stops_it(daemon: DaemonProcess) -> None:
    code, out = _on_a_terminal(daemon, b"n\n", "run", "--gpu", "T4", *CHEAP, "--name", "asked",
                               "--", "echo", "hi")  # fmt: skip
    assert code == 1
    assert "plan for job asked" in out and "Launch? [Y/n] " in out
    assert out.rstrip().endswith("not submitted")
    assert shown(daemon, "asked") is None
    # Enter takes the default, yes.
    code, out = _on_a_terminal(daemon, b"\n", "run", "--gpu", "T4", *CHEAP, "--name", "asked",
                               "--", "echo", "hi")  # fmt: skip
    assert code == 0, out
    assert "Launch? [Y/n] " in out and "asked: pending (policy job-asked" in out
    assert shown(daemon, "asked") is not None


def test_echo_hi_runs_without_a_policy_file_or_a_checkpoint(daemon: DaemonProcess) -> None:
    # The one job here that launches: a local instance, its agent, `echo hi`, exit 0.
    done = gpuopt(daemon, "run", "-y", "--gpu", "T4", "--provider", "local", "--name", "hi",
                  "--", "echo", "hi")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (
        "note: no checkpoint or checkpoint_dir: after an interruption the job restarts "
        "from the beginning" in done.stderr
    )
    ended = wait_until(
        lambda: (job := shown(daemon, "hi")) and job["state"] in {"succeeded", "failed"} and job,
        120,
        "the job to end",
    )
    assert ended["state"] == "succeeded", ended["reason"]
    # Launched where the job's own policy allows: a T4 (g4dn.*, or GCP's n1 with a T4).
    [attempt] = ended["attempts"]
    assert re.match(r"g4dn\.|n1-.*nvidia-tesla-t4", attempt["instance_type"]), attempt
    logs = gpuopt(daemon, "jobs", "logs", "hi")
    assert "\nhi\n" in logs.stdout


def test_yes_on_a_terminal_does_not_ask(daemon: DaemonProcess) -> None:
    code, out = _on_a_terminal(daemon, b"", "run", "-y", "--gpu", "T4", *CHEAP, "--name",
                               "sure", "--", "echo", "hi")  # fmt: skip
    assert code == 0, out
    assert "plan for job sure" in out and "Launch?" not in out
    assert "sure: pending (policy job-sure" in out


def test_the_default_name_is_the_scripts_made_unique() -> None:
    from optimizer.cli.run import default_name

    first, second = default_name(["python", "Train_v2.py", "--x"]), default_name(["python", "t.py"])
    assert re.fullmatch(r"train-v2-[0-9a-f]{4}", first) and re.fullmatch(r"t-[0-9a-f]{4}", second)
    assert re.fullmatch(r"echo-[0-9a-f]{4}", default_name(["echo", "hi"]))
