"""Jobs' code shipped as on a real cloud: a folder packed once per test session by
optimizer.code (as `gpuopt jobs submit` packs it) and uploaded to a test daemon, so that a
job runs from the archive its agent unpacks on the instance's own disk, never from here.

`ship(daemon)` uploads the examples/ folder (what `job_body` runs) unless the daemon holds it;
`ship(daemon, folder)` another folder, e.g. one a test wrote its own job script into.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from functools import cache
from pathlib import Path
from typing import Protocol

import httpx

from optimizer.code import Archive, pack
from tests.helpers.daemon import TOKEN

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


class Serving(Protocol):
    """A daemon serving the API with the test token: in process (Daemon) or not
    (DaemonProcess)."""

    @property
    def url(self) -> str: ...


@cache
def _scratch() -> Path:
    """Where this session's archives are packed; removed when the session ends."""
    folder = Path(tempfile.mkdtemp(prefix="gpuopt-test-code-"))
    atexit.register(shutil.rmtree, folder, True)
    return folder


@cache
def packed(folder: Path) -> Archive:
    """`folder` packed, once per session (a folder is not changed once a test packed it)."""
    return pack(folder, _scratch())


def code_ref(folder: Path = EXAMPLES) -> dict[str, object]:
    """The spec's `code: {sha256, size}` naming `folder`'s archive."""
    archive = packed(folder.resolve())
    return {"sha256": archive.sha256, "size": archive.size}


def ship(daemon: Serving, folder: Path = EXAMPLES, *, token: str = TOKEN) -> dict[str, object]:
    """Upload `folder`'s archive to `daemon` (unless it holds it) as the CLI does:
    HEAD /code/{sha256}, then PUT (with `token`); returns its `code_ref`."""
    archive = packed(folder.resolve())
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=daemon.url, headers=headers, timeout=60) as client:
        if client.head(f"/code/{archive.sha256}").status_code != 200:
            stored = client.put(f"/code/{archive.sha256}", content=archive.path.read_bytes())
            assert stored.status_code in (200, 201), stored.text
    return code_ref(folder)


def ship_files(daemon: Serving, folder: Path, files: dict[str, str]) -> dict[str, object]:
    """Write `files` (name: text) into the new folder `folder` and ship it."""
    folder.mkdir(parents=True)
    for name, text in files.items():
        (folder / name).write_text(text)
    return ship(daemon, folder)
