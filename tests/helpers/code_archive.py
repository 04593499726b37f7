"""A code archive of a few files, for the agent's code and standby tests."""

from __future__ import annotations

from pathlib import Path

from optimizer.code import pack
from optimizer.protocol import CodeArchive


def archive(tmp_path: Path) -> tuple[CodeArchive, bytes]:
    folder = tmp_path / "proj"
    folder.mkdir()
    (folder / "train.py").write_text("print('hi')\n")
    packed = pack(folder, tmp_path / "out")
    code = CodeArchive(sha256=packed.sha256, size=packed.size, url=f"/agent/code/{packed.sha256}")
    return code, packed.path.read_bytes()
