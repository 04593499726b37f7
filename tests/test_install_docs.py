"""What a new user copies and what CI runs: every README installs torch's CPU build before the
`probes` extra (or pip pulls the CUDA build and its `nvidia-*` packages), and CI points the
catalog tests at the shared price rows whenever they are beside the clone."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

SHARED_DIR_ENV = "GPUOPT_SHARED_DIR"  # what tests/conftest.py and bench/ read
ROOT = Path(__file__).resolve().parents[1]
SNIPPET = ROOT / ".ci" / "shared_dir.sh"
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
INLINE = re.compile(r"`([^`\n]+)`")


def readmes() -> list[Path]:
    return sorted(p for p in ROOT.rglob("README.md") if ".git" not in p.parts)


def snippets(text: str) -> list[str]:
    """Every fenced code block, and every inline code span of the prose around them."""
    blocks = FENCE.findall(text)
    prose = FENCE.sub("", text)
    return blocks + INLINE.findall(prose)


def pinned_torch() -> str:
    """The torch the README's test command (the one CI runs) installs first."""
    text = (ROOT / "README.md").read_text()
    command = text.split("<!-- ci:test-command -->", 1)[1]
    found = re.search(r"pip install (torch==[0-9.]+)", command)
    assert found, "the README's test command installs no pinned torch"
    return found.group(1)


def test_every_readme_installs_cpu_torch_before_the_probes_extra() -> None:
    torch = pinned_torch()
    assert torch == "torch==2.13.0"
    probes_installs = 0
    for readme in readmes():
        for snippet in snippets(readme.read_text()):
            commands = re.split(r"&&|;|\n", snippet)
            for i, command in enumerate(commands):
                if "pip install" not in command or "[probes" not in command:
                    continue
                probes_installs += 1
                before = [c for c in commands[:i] if "pip install" in c and torch in c.split()]
                where = readme.relative_to(ROOT)
                assert before, f"{where}: {command.strip()!r} without `pip install {torch}` first"
    assert probes_installs >= 2  # the README's test command and the example's install


def shared_dir_seen_by_ci(cwd: Path, environ: dict[str, str]) -> str | None:
    """GPUOPT_SHARED_DIR as a process CI starts sees it, after CI sourced the snippet in
    `cwd` (the repository root, as .ci/run runs it)."""
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", f'. "{SNIPPET}"; env'],
        cwd=cwd,
        env=environ,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    found = [
        line.split("=", 1)[1]
        for line in done.stdout.splitlines()
        if line.startswith(f"{SHARED_DIR_ENV}=")
    ]
    return found[0] if found else None


def test_ci_exports_the_shared_folder_beside_the_clone_as_an_absolute_path(tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    clone.mkdir()
    environ = {k: v for k, v in os.environ.items() if k != SHARED_DIR_ENV}
    assert shared_dir_seen_by_ci(clone, environ) is None  # no ../shared: nothing to point at
    (tmp_path / "shared" / "data" / "catalog").mkdir(parents=True)
    seen = shared_dir_seen_by_ci(clone, environ)
    assert seen == str((tmp_path / "shared").resolve()) and Path(seen).is_absolute()
    # A folder named on purpose wins.
    chosen = {**environ, SHARED_DIR_ENV: str(tmp_path / "elsewhere")}
    assert shared_dir_seen_by_ci(clone, chosen) == str(tmp_path / "elsewhere")


def test_ci_run_sources_the_snippet_from_the_repository_root_before_the_tests() -> None:
    lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    to_root = lines.index('cd "$(dirname "$0")/.."')
    sourced = lines.index(". .ci/shared_dir.sh")
    tests = lines.index('bash -euo pipefail -c "$tests"')
    assert to_root < sourced < tests


def test_the_readme_says_where_the_catalog_tests_find_the_shared_rows() -> None:
    text = (ROOT / "README.md").read_text()
    assert f"`{SHARED_DIR_ENV}` defaults to `../shared`" in " ".join(text.split())
    assert "marked `catalog`" in text
