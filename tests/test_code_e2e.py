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
    "data": pathlib.Path("data.txt").read_text(),
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


def spec_file(where: Path, name: str, workdir: str, ckpt: Path) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    path = where / f"{name}.yaml"
    path.write_text(
        f"name: {name}\n"
        "policy: local-eu\n"
        f"workdir: {workdir}\n"
        "setup: test -f train.py && touch setup.done\n"
        f"run: {sys.executable} train.py\n"
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
    spec = spec_file(tmp_path / "specs", "shipped", "../elsewhere/proj/sub", ckpt)
    out = gpuopt(tmp_path, daemon, "jobs", "submit", str(spec))
    line = next(x for x in out.splitlines() if x.startswith("code: "))
    found = re.fullmatch(r"code: sha256:([0-9a-f]{12}) \(\d+\.\d\d MiB, (\d+) files\)", line)
    assert found is not None, line
    assert found.group(2) == "3"  # .gpuoptignore, sub/train.py, sub/data.txt
    shutil.rmtree(proj)  # from here on, only the daemon has the code

    # The same folder again, with --code naming an ancestor of the workdir.
    proj = project(tmp_path / "elsewhere" / "proj")
    ckpt_b = tmp_path / "ckpt-b"
    spec_b = spec_file(tmp_path / "specs", "again", str(proj / "sub"), ckpt_b)
    out_b = gpuopt(tmp_path, daemon, "jobs", "submit", str(spec_b), "--code", str(proj))
    assert f"code: sha256:{found.group(1)}" in out_b  # the same bytes: the same hash
    shutil.rmtree(proj)

    for name in ("shipped", "again"):
        wait_until(lambda n=name: state_of(daemon, n)["state"] == "succeeded", 90, f"{name} done")

    job = state_of(daemon, "shipped")
    code = job["spec"]["code"]
    assert code["sha256"].startswith(found.group(1)) and job["spec"]["workdir"] == "sub"
    assert state_of(daemon, "again")["spec"]["workdir"] == "sub"
    for folder in (ckpt, ckpt_b):
        ran = json.loads((folder / "ran.json").read_text())
        assert ran["data"] == "shipped with the code\n" and ran["setup_ran"] is True
        # unpacked on the instance's disk, beside its agent folder, under the hash
        cwd = Path(ran["cwd"])
        assert cwd.name == "sub" and cwd.parent.name == code["sha256"]
        assert cwd.parent.parent.name == "code" and not (cwd / "scratch.log").exists()
        assert str(cwd).startswith(str(tmp_path / "local-cloud"))

    shown = gpuopt(tmp_path, daemon, "jobs", "show", "shipped")
    assert f"  code: sha256:{found.group(1)} (" in shown
