"""Packing a folder into a code archive: the files git would track, as a deterministic tar.gz.

What goes in: every regular file and every symbolic link that stays inside the folder, less
what a `.gitignore` or `.gpuoptignore` (gitignore syntax, read after the `.gitignore` of the
same folder, so it can re-include) at any level excludes, and never `.git/`. A pattern in a
deeper folder's file outranks the shallower ones, as in git; an excluded folder is not
entered (its files cannot be re-included, as in git). A folder inside a git repository also
follows the ignore files of the folders above it, up to the repository's top.

The archive is the same bytes for the same files whoever packs it and whenever: entries
sorted by path, every time 0, owner 0:0 without names, modes reduced to 0644 or 0755 (the
executable bit is all that is kept), gzip without a name or time. Its name is its SHA-256.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import stat
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pathspec

MIB = 1 << 20
DEFAULT_MAX_MIB = 512
IGNORE_FILES = (".gitignore", ".gpuoptignore")
ALWAYS_SKIPPED = frozenset({".git"})
SUFFIX = ".tar.gz"
_GZIP_LEVEL = 6
_CHUNK = 1 << 20


class CodeError(Exception):
    """A folder that cannot be packed, or an archive that cannot be used; the message names
    the path and the problem."""


class TooLarge(CodeError):
    """The folder's files add up to more than the cap."""


@dataclass(frozen=True, slots=True)
class Entry:
    """One path the archive holds: a file (`link` None) or a symbolic link to `link`."""

    path: str  # relative, POSIX separators
    size: int
    executable: bool = False
    link: str | None = None


@dataclass(frozen=True, slots=True)
class Archive:
    """A packed folder: the archive file, named `<sha256>.tar.gz`."""

    path: Path
    sha256: str
    size: int  # bytes of the archive
    files: int  # entries (files and links)
    content_bytes: int  # bytes of the files packed, before compression


def _read_rules(folder: Path) -> pathspec.PathSpec | None:
    """The patterns of a folder's ignore files (None: it has none)."""
    lines: list[str] = []
    for name in IGNORE_FILES:
        try:
            lines += (folder / name).read_text(encoding="utf-8", errors="replace").splitlines()
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as exc:
            raise CodeError(f"{folder / name}: cannot read it ({exc.strerror})") from None
    if not lines:
        return None
    import pathspec  # here, not at the top: the daemon imports this package and never packs

    return pathspec.GitIgnoreSpec.from_lines(lines)


@dataclass(frozen=True, slots=True)
class _Layer:
    """One folder's patterns: `base` is where that folder is under the root ("" for the
    root, or for a folder above it); `lift` is where the root is under that folder (for
    the folders above the root, up to the git repository's top)."""

    base: str
    lift: str
    spec: pathspec.PathSpec

    def inner(self, rel: str) -> str:
        """`rel` (relative to the root) relative to this layer's folder."""
        below = rel[len(self.base) + 1 :] if self.base else rel
        return f"{self.lift}/{below}" if self.lift else below


class _Rules:
    """The ignore files in force in one folder, shallowest first."""

    def __init__(self, layers: tuple[_Layer, ...] = ()) -> None:
        self.layers = layers

    @classmethod
    def above(cls, root: Path) -> _Rules:
        """The rules of the folders above `root` up to its git repository's top (none when
        it is in no repository), as git would apply them to the root's files."""
        layers: list[_Layer] = []
        here = root.resolve()
        for parent in here.parents:
            spec = _read_rules(parent)
            if spec is not None:
                layers.append(_Layer("", here.relative_to(parent).as_posix(), spec))
            if (parent / ".git").exists():
                return cls(tuple(reversed(layers)))
        return cls()

    def below(self, folder: Path, rel: str) -> _Rules:
        """The rules for `folder` (at `rel` under the root): these, then its own files."""
        spec = _read_rules(folder)
        return self if spec is None else _Rules((*self.layers, _Layer(rel, "", spec)))

    def ignored(self, rel: str, *, folder: bool) -> bool:
        """Whether the path (relative to the root) is excluded: the deepest file with a
        pattern that matches it decides."""
        for layer in reversed(self.layers):
            inner = layer.inner(rel)
            result = layer.spec.check_file(inner + "/" if folder else inner)
            if result.include is not None:
                return bool(result.include)
        return False


def _inside(target: Path, root: Path) -> bool:
    return target == root or root in target.parents


def walk(root: Path) -> list[Entry]:
    """The entries that the archive of `root` holds, sorted by path."""
    root = Path(root)
    if not root.is_dir():
        raise CodeError(f"{root}: not a folder")
    real_root = root.resolve()
    found: list[Entry] = []
    for entry in _walk(root, real_root, "", _Rules.above(root).below(root, "")):
        found.append(entry)
    return sorted(found, key=lambda e: e.path)


def _walk(folder: Path, real_root: Path, rel: str, rules: _Rules) -> Iterator[Entry]:
    try:
        children = sorted(os.scandir(folder), key=lambda d: d.name)
    except OSError as exc:
        raise CodeError(f"{folder}: cannot list it ({exc.strerror})") from None
    for child in children:
        path = f"{rel}/{child.name}" if rel else child.name
        if child.name in ALWAYS_SKIPPED:
            continue
        if child.is_symlink():
            link = _link(Path(child.path), real_root)
            if link is not None and not rules.ignored(path, folder=False):
                yield Entry(path, 0, link=link)
            continue
        if child.is_dir(follow_symlinks=False):
            if not rules.ignored(path, folder=True):
                below = Path(child.path)
                yield from _walk(below, real_root, path, rules.below(below, path))
            continue
        if not child.is_file(follow_symlinks=False) or rules.ignored(path, folder=False):
            continue  # sockets, fifos, devices: nothing a job's code holds
        info = child.stat(follow_symlinks=False)
        yield Entry(path, info.st_size, executable=bool(info.st_mode & stat.S_IXUSR))


def _link(link: Path, real_root: Path) -> str | None:
    """A link's target relative to the link's folder, when it resolves inside the root (and
    is not the root's own .git); None for one that points outside or nowhere."""
    try:
        target = link.resolve(strict=True)
    except (OSError, RuntimeError):  # dangling, or a loop
        return None
    if not _inside(target, real_root) or target == real_root:
        return None
    if ALWAYS_SKIPPED & set(target.relative_to(real_root).parts):
        return None
    here = link.parent.resolve()
    return os.path.relpath(target, here).replace(os.sep, "/")


def check_size(root: Path, entries: list[Entry], max_mib: float) -> None:
    """TooLarge naming the total and the five biggest files when the files add up to more
    than `max_mib`."""
    total = sum(e.size for e in entries)
    if total <= max_mib * MIB:
        return
    biggest = sorted(entries, key=lambda e: (-e.size, e.path))[:5]
    listed = ", ".join(f"{e.path} ({e.size / MIB:.1f} MiB)" for e in biggest)
    raise TooLarge(
        f"{root}: {total / MIB:.1f} MiB in {len(entries)} files, over the limit of "
        f"{max_mib:g} MiB (code.max_mib); the biggest: {listed}. Leave files out with a "
        ".gpuoptignore (gitignore syntax) in the folder"
    )


def pack(root: Path, out_dir: Path, *, max_mib: float = DEFAULT_MAX_MIB) -> Archive:
    """Pack `root` into `out_dir/<sha256>.tar.gz` (see the module's docstring)."""
    root = Path(root)
    entries = walk(root)
    check_size(root, entries, max_mib)
    out_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=".pack-", suffix=SUFFIX, dir=out_dir)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as raw:
            digest = _Hashing(raw)
            with (
                gzip.GzipFile(
                    filename="", mode="wb", fileobj=digest, mtime=0, compresslevel=_GZIP_LEVEL
                ) as gz,
                tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
            ):
                for entry in entries:
                    _add(tar, root, entry)
        sha = digest.hash.hexdigest()
        final = out_dir / f"{sha}{SUFFIX}"
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return Archive(
        path=final,
        sha256=sha,
        size=digest.size,
        files=len(entries),
        content_bytes=sum(e.size for e in entries),
    )


def _add(tar: tarfile.TarFile, root: Path, entry: Entry) -> None:
    info = tarfile.TarInfo(str(PurePosixPath(entry.path)))
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    if entry.link is not None:
        info.type = tarfile.SYMTYPE
        info.linkname = entry.link
        info.mode = 0o777
        tar.addfile(info)
        return
    info.mode = 0o755 if entry.executable else 0o644
    path = root / entry.path
    try:
        with path.open("rb") as source:
            info.size = os.fstat(source.fileno()).st_size
            tar.addfile(info, source)
    except OSError as exc:
        raise CodeError(f"{path}: cannot read it ({exc.strerror})") from None


class _Hashing(io.RawIOBase):
    """A write-only stream that hashes and counts what passes to `out`."""

    def __init__(self, out: io.BufferedWriter | io.BufferedRandom) -> None:
        self.out = out
        self.hash = hashlib.sha256()
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]
        self.hash.update(data)
        self.size += len(data)
        self.out.write(data)
        return len(data)


def sha256_file(path: Path) -> str:
    """The SHA-256 of a file, hex."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as source:
        while chunk := source.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()
