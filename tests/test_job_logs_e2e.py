"""Job logs end to end: a real daemon (in-process, real HTTP), the local cloud's instances
running the real agent, a job that prints as it goes, interrupted once and relaunched, and
`gpuopt jobs logs` as a real process reading it all back."""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest

from optimizer.daemon.service import Daemon
from providers.local import LocalCloud
from tests.helpers import TOKEN, api, run_gpuopt, start_gpuopt, wait_until
from tests.helpers.code import ship_files
from tests.helpers.jobs import E2E_FIXTURES, job_body, running_instance, state_of

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("daemon_env")]

# Counts to TOTAL, one stdout line a step and a stderr line every tenth, resuming from its
# checkpoint (gpuopt's convention: the agent ships it to the bucket and the next attempt's agent
# restores it); on SIGTERM it saves and exits 143. The first attempt steps five times slower
# (400 steps: 40 s at 0.02 s), so it is still running however long a loaded machine takes to
# start the CLI processes that follow it before the test interrupts it.
PRINTER = """
import glob, json, os, signal, sys, time
root = os.environ["GPUOPT_CHECKPOINT_DIR"]
attempt = os.environ["GPUOPT_ATTEMPT"]
marks = glob.glob(os.path.join(root, "n-*", ".gpuopt-committed"))
n = max((json.load(open(m))["step"] for m in marks), default=0)
def save():  # a checkpoint folder, committed by its marker written last
    folder = os.path.join(root, f"n-{n:08d}")
    if os.path.exists(os.path.join(folder, ".gpuopt-committed")):
        return
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "n.json"), "w") as f:
        json.dump({"n": n}, f)
    with open(os.path.join(folder, ".marker.tmp"), "w") as f:
        json.dump({"step": n}, f)
    os.replace(os.path.join(folder, ".marker.tmp"), os.path.join(folder, ".gpuopt-committed"))
def term(*_):
    save()
    print(f"attempt {attempt} stopped at {n}", flush=True)
    sys.exit(143)
signal.signal(signal.SIGTERM, term)
print(f"attempt {attempt} from {n}", flush=True)
while n < int(sys.argv[1]):
    n += 1
    print(f"attempt {attempt} step {n}", flush=True)
    if n % 10 == 0:
        print(f"attempt {attempt} warn {n}", file=sys.stderr, flush=True)
        save()
    time.sleep(float(sys.argv[2]) * (5 if attempt == "1" else 1))
save()
print(f"attempt {attempt} done at {n}", flush=True)
"""
HEADER = re.compile(r"^==> attempt (\d) · local eu-\S+ \S+ (spot|on_demand) · i-local-\d+ <==$")


def by_attempt(text: str) -> dict[str, list[str]]:
    """Each attempt's lines in the order shown, wherever its header appeared (blank
    separator lines left out)."""
    out: dict[str, list[str]] = {}
    current: list[str] = []
    for line in text.splitlines():
        found = HEADER.match(line)
        if found:
            current = out.setdefault(found.group(1), [])
        elif line:
            current.append(line)
    return out


clock, cloud, daemon = E2E_FIXTURES


def gpuopt_logs(tmp_path: Path, daemon: Daemon, *args: str):
    env = {"GPUOPT_API_URL": daemon.url, "GPUOPT_API_TOKEN": TOKEN}
    return run_gpuopt(tmp_path / "cli", "jobs", "logs", *args, env=env)


def shipped(daemon: Daemon, name: str) -> str:
    with api(daemon) as client:
        return client.get(f"/jobs/{name}/logs").text


def test_logs_show_every_attempt_of_an_interrupted_job_and_follow_it_to_its_end(
    tmp_path: Path, daemon: Daemon, cloud: LocalCloud
) -> None:
    code = ship_files(daemon, tmp_path / "job-code", {"printer.py": PRINTER})
    body = job_body("printer", tmp_path / "ckpt", steps=1, code=code)
    body["run"] = "python printer.py 400 0.02"
    with api(daemon) as client:
        assert client.post("/jobs", json=body).status_code == 201
    first = wait_until(lambda: running_instance(cloud, "printer", 1), 30, "attempt 1 running")
    wait_until(lambda: "attempt 1 step 30\n" in shipped(daemon, "printer"), 30, "output")

    env = {"GPUOPT_API_URL": daemon.url, "GPUOPT_API_TOKEN": TOKEN}
    follower = start_gpuopt(tmp_path / "cli", "jobs", "logs", "printer", "--follow", env=env)
    # As a shell starts a foreground command: Ctrl-C not ignored, whatever the test process
    # inherited (a child inherits an ignored SIGINT, and pytest workers may run with one).
    quitter = start_gpuopt(
        tmp_path / "cli",
        *("jobs", "logs", "printer", "-f"),
        env=env,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        assert quitter.stdout is not None
        assert quitter.stdout.readline().startswith("==> attempt 1 ")  # it is following
        quitter.send_signal(signal.SIGINT)  # Ctrl-C
        _, err = quitter.communicate(timeout=30)
        assert quitter.returncode == 130 and "Traceback" not in err, err

        cloud.interrupt(first)
        wait_until(lambda: running_instance(cloud, "printer", 2), 60, "attempt 2 running")
        wait_until(lambda: state_of(daemon, "printer")["state"] == "succeeded", 90, "the end")
        followed, err = follower.communicate(timeout=60)  # it ends by itself
    finally:
        for proc in (follower, quitter):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert follower.returncode == 0, err

    whole = gpuopt_logs(tmp_path, daemon, "printer")
    assert whole.returncode == 0, whole.stderr
    # The follower saw all of it, the end included. Like `tail -f` over several files, it
    # writes an attempt's header again when that attempt's output comes back after another's
    # (late output of the interrupted attempt during the handover), so compare per attempt.
    assert by_attempt(followed) == by_attempt(whole.stdout)
    lines = whole.stdout.splitlines()
    headers = [i for i, line in enumerate(lines) if line.startswith("==>")]
    assert [HEADER.match(lines[i]).group(1) for i in headers] == ["1", "2"]  # type: ignore[union-attr]
    one, two = lines[headers[0] + 1 : headers[1] - 1], lines[headers[1] + 1 :]
    assert lines[headers[1] - 1] == ""  # a blank line between attempts
    steps_one = [int(x.split()[-1]) for x in one if " step " in x]
    assert steps_one == list(range(1, len(steps_one) + 1)) and len(steps_one) >= 30
    assert "attempt 1 warn 10" in one  # stderr shipped too
    resumed = int(next(x for x in two if x.startswith("attempt 2 from ")).split()[-1])
    steps_two = [int(x.split()[-1]) for x in two if " step " in x]
    assert resumed > 0 and steps_two == list(range(resumed + 1, 401))
    assert "attempt 2 done at 400" in two and "attempt 2 warn 400" in two
    exited = [i for i, x in enumerate(two) if x.endswith("] run: exited with 0")]
    assert exited and exited[0] > two.index("attempt 2 done at 400")  # the agent's last note

    tail = gpuopt_logs(tmp_path, daemon, "printer", "--tail", "3")
    assert tail.stdout.splitlines() == [lines[headers[1]], *lines[-3:]]
    only = gpuopt_logs(tmp_path, daemon, "printer", "--attempt", "1")
    assert only.stdout.splitlines() == lines[headers[0] : headers[1] - 1]
    missing = gpuopt_logs(tmp_path, daemon, "printer", "--attempt", "3")
    assert missing.returncode == 2 and missing.stdout == ""
    assert missing.stderr == (
        "gpuopt: error: 404: job 'printer' has no attempt 3; its attempts: 1, 2\n"
    )
    unknown = gpuopt_logs(tmp_path, daemon, "nope")
    assert (unknown.returncode, unknown.stderr) == (2, "gpuopt: error: 404: no job named 'nope'\n")
