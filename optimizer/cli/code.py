"""`gpuopt jobs submit`'s code shipping: which folder a spec ships, packing it and
uploading it to the daemon (docs/code.md)."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, TextIO

from optimizer.cli import client
from optimizer.cli.common import fail

if TYPE_CHECKING:
    from optimizer.jobs.spec import JobSpec


class ShipError(ValueError):
    """The spec's workdir and --code do not fit together; the message says how."""


@dataclass(frozen=True, slots=True)
class Shipping:
    """The folder to pack, and the spec's workdir inside the archive (None: its root)."""

    root: Path
    workdir: str | None


def _local(workdir: str, spec_dir: Path) -> Path:
    path = Path(workdir).expanduser()
    return path if path.is_absolute() else spec_dir / path


def _relative(path: Path, root: Path) -> str | None:
    """`path` as a POSIX path inside `root` (None: root itself); ValueError when outside."""
    rel = path.resolve().relative_to(root.resolve())
    return None if rel == Path(".") else PurePosixPath(*rel.parts).as_posix()


def shipping(workdir: str | None, spec_dir: Path, code: Path | None) -> Shipping | None:
    """What a submit ships: `code` (--code DIR), else a `workdir` that is a folder on this
    machine (relative to the spec file's folder, or absolute); None when neither (a workdir
    that is no local folder names one on the instance, left as it is)."""
    if code is None:
        if workdir is None:
            return None
        local = _local(workdir, spec_dir)
        return Shipping(local, None) if local.is_dir() else None
    if not code.is_dir():
        raise ShipError(f"--code {code}: not a folder")
    if workdir is None:
        return Shipping(code, None)
    try:
        return Shipping(code, _relative(_local(workdir, spec_dir), code))
    except ValueError:
        pass
    inner = PurePosixPath(workdir)
    if not inner.is_absolute() and ".." not in inner.parts and (code / workdir).is_dir():
        return Shipping(code, inner.as_posix())
    raise ShipError(
        f"workdir {workdir!r} is neither inside --code {code} nor a folder in it: with --code "
        "the commands run inside the archive"
    )


def ship(
    spec: JobSpec, spec_file: Path, code: Path | None, api: str | None, *, out: TextIO
) -> JobSpec:
    """The spec to submit: when it ships code, the folder packed and uploaded (unless the
    daemon holds it already), `code` set and `workdir` made relative to the archive; the
    `code: …` line goes to `out`."""
    from optimizer.code import MIB, CodeError, pack
    from optimizer.jobs.spec import CodeRef

    try:
        found = shipping(spec.workdir, spec_file.resolve().parent, code)
    except ShipError as exc:
        fail(str(exc))
    if found is None:
        return spec
    with tempfile.TemporaryDirectory(prefix="gpuopt-code-") as scratch:
        try:
            archive = pack(found.root, Path(scratch))
        except CodeError as exc:
            fail(str(exc))
        print(
            f"code: sha256:{archive.sha256[:12]} ({archive.size / MIB:.2f} MiB, "
            f"{archive.files} files)",
            file=out,
        )
        _upload(archive.path, archive.sha256, api)
    ref = CodeRef(sha256=archive.sha256, size=archive.size)
    return spec.model_copy(update={"code": ref, "workdir": found.workdir})


def _upload(path: Path, sha256: str, api: str | None) -> None:
    """PUT the archive unless HEAD says the daemon holds it."""
    try:
        held = client.request("HEAD", f"/code/{sha256}", api)
    except client.NoDaemon as exc:
        fail(str(exc))
    if held.status_code == 200:
        return
    if held.status_code != 404:
        client.check(held)
    size = os.stat(path).st_size
    try:
        # An upload may take a while: a minute plus a second per MiB.
        answer = client.request(
            "PUT", f"/code/{sha256}", api, upload=path, timeout=60 + size / (1 << 20)
        )
    except client.NoDaemon as exc:
        # A daemon refuses an archive over its code.max_mib at once and closes the connection.
        fail(
            f"uploading the code archive ({size / (1 << 20):.2f} MiB): {exc}; a daemon "
            "cuts off an archive over its code.max_mib"
        )
    client.check(answer)
