"""Unpacking a code archive, safely: nothing lands outside the target folder.

Refused (UnsafeArchive, naming the entry): absolute paths, `..` components, links whose
target leaves the folder, hard links, devices and fifos. The archive is unpacked into a
temporary folder beside the target, which is then renamed into place, so the target is either
absent or complete (a reader that finds it may use it).
"""

from __future__ import annotations

import os
import posixpath
import shutil
import tarfile
import tempfile
from pathlib import Path

from optimizer.code.pack import CodeError, sha256_file


class UnsafeArchive(CodeError):
    """An archive with an entry that would land outside the target, or that is no file."""


class BadArchive(CodeError):
    """An archive that is not what it should be: not a tar.gz, or another hash."""


def _safe_name(name: str) -> str:
    """The entry's name, normalized; UnsafeArchive for one that leaves the folder."""
    if not name or name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        raise UnsafeArchive(f"entry {name!r}: an absolute path")
    parts = name.split("/")
    if ".." in parts:
        raise UnsafeArchive(f"entry {name!r}: a '..' component leaves the folder")
    clean = posixpath.normpath(name)
    if clean in ("", "."):
        raise UnsafeArchive(f"entry {name!r}: names the folder itself")
    return clean


def check_members(tar: tarfile.TarFile) -> list[tarfile.TarInfo]:
    """Every entry, checked (see the module's docstring)."""
    members = tar.getmembers()
    for member in members:
        name = _safe_name(member.name)
        if member.issym():
            target = member.linkname
            if not target or target.startswith("/"):
                raise UnsafeArchive(f"entry {name!r}: a link to an absolute path ({target!r})")
            landed = posixpath.normpath(posixpath.join(posixpath.dirname(name), target))
            if landed == ".." or landed.startswith("../") or landed == ".":
                raise UnsafeArchive(f"entry {name!r}: a link out of the folder ({target!r})")
        elif member.islnk():
            raise UnsafeArchive(f"entry {name!r}: a hard link (not allowed)")
        elif not (member.isfile() or member.isdir()):
            raise UnsafeArchive(f"entry {name!r}: not a file, folder or link")
    return members


def unpack(archive: Path, target: Path, *, sha256: str | None = None) -> Path:
    """Unpack `archive` into `target` (which must not exist yet; returned as it is when it
    does: an earlier unpack of the same archive). `sha256`: refuse an archive of another hash
    (BadArchive)."""
    target = Path(target)
    if target.is_dir():
        return target
    if sha256 is not None:
        found = sha256_file(archive)
        if found != sha256:
            raise BadArchive(f"{archive}: sha256 is {found}, expected {sha256}")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        try:
            with tarfile.open(archive, mode="r:gz") as tar:
                _extract(tar, staging)
        except (tarfile.TarError, EOFError, OSError) as exc:
            if isinstance(exc, OSError) and exc.errno is not None and exc.filename:
                raise CodeError(f"{exc.filename}: {exc.strerror}") from None
            raise BadArchive(f"{archive}: not a readable tar.gz ({exc})") from None
        try:
            os.rename(staging, target)
        except OSError:
            if not target.is_dir():  # another unpack won the race: theirs is as good
                raise
            shutil.rmtree(staging, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def _extract(tar: tarfile.TarFile, into: Path) -> None:
    """Write each checked entry under `into` ourselves (no tarfile extraction filters needed,
    which differ between Python versions); links last, so none is followed while writing."""
    members = check_members(tar)
    links = []
    for member in members:
        path = into / _safe_name(member.name)
        if member.isdir():
            path.mkdir(parents=True, exist_ok=True)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        if member.issym():
            links.append((path, member.linkname))
            continue
        source = tar.extractfile(member)
        if source is None:
            raise BadArchive(f"entry {member.name!r}: no data")
        with source, path.open("xb") as out:
            shutil.copyfileobj(source, out)
        os.chmod(path, 0o755 if member.mode & 0o111 else 0o644)
    for path, linkname in links:
        path.symlink_to(linkname)
