"""A job's code shipped end to end on the local cloud: `gpuopt jobs submit` packs the folder
and uploads it, the folder is then removed from where it was, and the agent fetches the
archive, unpacks it on the instance's disk and runs `setup` and `run` in it."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest

from optimizer.daemon.service import Daemon
from providers.local import LocalCloud
from tests.helpers import wait_until
from tests.helpers.code import code_ref
from tests.helpers.daemon import TOKEN, run_gpuopt
from tests.helpers.jobs import E2E_FIXTURES, state_of

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("daemon_env")]

clock, cloud, daemon = E2E_FIXTURES

SCRIPT = """\
import json, os, pathlib
out = pathlib.Path(os.environ["GPUOPT_CHECKPOINT_DIR"]) / "ran.json"
out.parent.mkdir(parents=True, exist_ok=True)
out.write_text(json.dumps({
    "cwd": os.getcwd(),
    "data": (pathlib.Path(__file__).parent / "data.txt").read_text(),
    "scratch_shipped": (pathlib.Path(__file__).parent / "scratch.log").exists(),
    "setup_ran": pathlib.Path("setup.done").exists(),
}))
print("ran in", os.getcwd(), flush=True)
"""


def project(where: Path) -> Path:
    """A folder holding the job's script, in a sub-folder, and a file it must not ship."""
    (where / "sub").mkdir(parents=True)
    (where / "sub" / "train.py").write_text(SCRIPT)
    (where / "sub" / "data.txt").write_text("shipped with the code\n")
    (where / "sub" / "scratch.log").write_text("left out\n")
    (where / ".gpuoptignore").write_text("*.log\n")
    return where


def spec_file(where: Path, name: str, workdir: str, script: str, ckpt: Path) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    path = where / f"{name}.yaml"
    path.write_text(
        f"name: {name}\n"
        "policy: local-eu\n"
        f"workdir: {workdir}\n"
        f"setup: test -f {script} && touch setup.done\n"
        f"run: {sys.executable} {script}\n"
        # A shared folder: the test reads what the job writes there.
        f"checkpoint_dir: {ckpt}\n"
        "probes: none\n"
    )
    return path


def gpuopt(tmp_path: Path, daemon: Daemon, *args: str) -> str:
    env = {"GPUOPT_API_URL": daemon.url, "GPUOPT_API_TOKEN": TOKEN}
    done = run_gpuopt(tmp_path / "cli", *args, env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_job_runs_from_the_uploaded_folder_after_it_is_gone(
    tmp_path: Path, daemon: Daemon, cloud: LocalCloud
) -> None:
    # The spec names its workdir relative to its own folder; the CLI ships that folder.
    proj = project(tmp_path / "elsewhere" / "proj")
    ckpt = tmp_path / "ckpt-a"
    spec = spec_file(tmp_path / "specs", "shipped", "../elsewhere/proj", "sub/train.py", ckpt)
    out = gpuopt(tmp_path, daemon, "jobs", "submit", str(spec))
    line = next(x for x in out.splitlines() if x.startswith("code: "))
    found = re.fullmatch(r"code: sha256:([0-9a-f]{12}) \(\d+\.\d\d MiB, (\d+) files\)", line)
    assert found is not None, line
    assert found.group(2) == "3"  # .gpuoptignore, sub/train.py, sub/data.txt
    shutil.rmtree(proj)  # from here on, only the daemon has the code

    # The same folder again, with --code naming an ancestor of the workdir.
    proj = project(tmp_path / "elsewhere" / "proj")
    ckpt_b = tmp_path / "ckpt-b"
    spec_b = spec_file(tmp_path / "specs", "again", str(proj / "sub"), "train.py", ckpt_b)
    out_b = gpuopt(tmp_path, daemon, "jobs", "submit", str(spec_b), "--code", str(proj))
    assert f"code: sha256:{found.group(1)}" in out_b  # the same bytes: the same hash
    shutil.rmtree(proj)

    for name in ("shipped", "again"):
        wait_until(lambda n=name: state_of(daemon, n)["state"] == "succeeded", 90, f"{name} done")

    job = state_of(daemon, "shipped")
    code = job["spec"]["code"]
    assert code["sha256"].startswith(found.group(1)) and job["spec"]["workdir"] is None
    assert state_of(daemon, "again")["spec"]["workdir"] == "sub"
    kept = daemon.config.effective_data_dir / "code"
    held = sorted(p.name for p in kept.glob("*.tar.gz"))  # once, beside e2e_daemon's examples/
    assert held == sorted({f"{code['sha256']}.tar.gz", f"{code_ref()['sha256']}.tar.gz"})
    for folder, sub in ((ckpt, False), (ckpt_b, True)):
        ran = json.loads((folder / "ran.json").read_text())
        assert ran["data"] == "shipped with the code\n" and ran["setup_ran"] is True
        assert ran["scratch_shipped"] is False  # left out by the .gpuoptignore
        # unpacked on the instance's disk, beside its agent folder, under the hash
        cwd = Path(ran["cwd"])
        unpacked = cwd.parent if sub else cwd
        assert cwd.name == ("sub" if sub else code["sha256"])
        assert unpacked.name == code["sha256"] and unpacked.parent.name == "code"
        assert str(unpacked).startswith(str(tmp_path / "local-cloud"))

    shown = gpuopt(tmp_path, daemon, "jobs", "show", "shipped")
    assert f"  code: sha256:{found.group(1)} (" in shown
