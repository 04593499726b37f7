"""Packing a job's folder: which files go in, the same bytes every time, the size cap, and
unpacking that refuses archives reaching outside their folder."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from optimizer.code import (
    BadArchive,
    CodeError,
    TooLarge,
    UnsafeArchive,
    pack,
    sha256_file,
    unpack,
    walk,
)


def write(root: Path, rel: str, text: str = "x", *, mode: int | None = None) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if mode is not None:
        os.chmod(path, mode)
    return path


def names(root: Path) -> list[str]:
    return [e.path for e in walk(root)]


def test_gitignore_rules_at_every_level_with_negation(tmp_path: Path) -> None:
    root = tmp_path / "proj"
    write(root, ".gitignore", "*.log\n!keep.log\nbuild/\n/data\n")
    write(root, "train.py")
    write(root, "run.log")
    write(root, "keep.log")
    write(root, "build/out.bin")
    write(root, "data/big.bin")
    write(root, "src/data/small.txt")  # `/data` is anchored to the root: this one stays
    write(root, "src/.gitignore", "*.tmp\n!important.log\n")
    write(root, "src/a.tmp")
    write(root, "src/important.log")  # re-included by the deeper file
    write(root, "src/other.log")
    write(root, "src/model.py")
    write(root, "notes.tmp")  # *.tmp is src/'s rule only
    assert names(root) == [
        ".gitignore",
        "keep.log",
        "notes.tmp",
        "src/.gitignore",
        "src/data/small.txt",
        "src/important.log",
        "src/model.py",
        "train.py",
    ]


def test_a_folder_inside_a_repository_follows_the_ignore_files_above_it(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    write(repo, ".gitignore", "__pycache__/\n*.pyc\nexamples/out/\n")
    write(repo, "examples/train.py")
    write(repo, "examples/__pycache__/train.cpython-311.pyc")
    write(repo, "examples/out/result.txt")  # anchored below the repository's top
    write(repo, "examples/notes.pyc")
    write(tmp_path, ".gitignore", "*.py\n")  # above the repository: not git's business
    assert names(repo / "examples") == ["train.py"]
    # outside any repository, only the folder's own files count
    write(tmp_path, "loose/__pycache__/x.pyc")
    assert names(tmp_path / "loose") == ["__pycache__/x.pyc"]


def test_gpuoptignore_adds_rules_and_can_reinclude(tmp_path: Path) -> None:
    root = tmp_path / "proj"
    write(root, ".gitignore", "*.ckpt\n")
    write(root, ".gpuoptignore", "datasets/\n!tiny.ckpt\n")
    write(root, "tiny.ckpt")
    write(root, "huge.ckpt")
    write(root, "datasets/imagenet.tar")
    write(root, "main.py")
    assert names(root) == [".gitignore", ".gpuoptignore", "main.py", "tiny.ckpt"]


def test_git_folder_and_links_outside_are_skipped(tmp_path: Path) -> None:
    root = tmp_path / "proj"
    write(root, "main.py")
    write(root, ".git/config")
    write(root, "lib/util.py")
    outside = write(tmp_path, "secret.txt")
    (root / "leak.txt").symlink_to(outside)
    (root / "abs-inside.py").symlink_to(root / "main.py")  # absolute, but inside
    (root / "libs").symlink_to("lib")
    (root / "dangling").symlink_to(root / "nowhere")
    entries = {e.path: e for e in walk(root)}
    assert sorted(entries) == ["abs-inside.py", "lib/util.py", "libs", "main.py"]
    assert entries["abs-inside.py"].link == "main.py"  # made relative, so it survives a move
    assert entries["libs"].link == "lib"


def test_same_folder_twice_and_other_mtimes_give_the_same_sha256(tmp_path: Path) -> None:
    root = tmp_path / "proj"
    write(root, "main.py", "print('hi')\n")
    write(root, "scripts/run.sh", "#!/bin/sh\necho run\n", mode=0o755)
    write(root, "data/a.txt", "a" * 5000)
    first = pack(root, tmp_path / "out1")
    second = pack(root, tmp_path / "out2")
    assert first.sha256 == second.sha256 and first.size == second.size
    assert first.path.name == f"{first.sha256}.tar.gz"
    assert sha256_file(first.path) == first.sha256
    for i, path in enumerate(sorted(root.rglob("*"))):
        os.utime(path, (1_000_000 + i, 2_000_000 + i * 7))
    os.chmod(root / "main.py", 0o600)  # only the executable bit counts
    assert pack(root, tmp_path / "out3").sha256 == first.sha256
    write(root, "main.py", "print('changed')\n")
    assert pack(root, tmp_path / "out4").sha256 != first.sha256


def test_archive_keeps_the_executable_bit_and_no_owner_or_time(tmp_path: Path) -> None:
    root = tmp_path / "proj"
    write(root, "run.sh", "#!/bin/sh\n", mode=0o750)
    write(root, "lib.py", mode=0o640)
    archive = pack(root, tmp_path / "out")
    with tarfile.open(archive.path) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert [m for m in members] == ["lib.py", "run.sh"]
    assert members["run.sh"].mode == 0o755 and members["lib.py"].mode == 0o644
    assert {(m.mtime, m.uid, m.gid, m.uname, m.gname) for m in members.values()} == {
        (0, 0, 0, "", "")
    }
    assert archive.files == 2


def test_folder_over_the_cap_names_the_total_and_the_biggest_files(tmp_path: Path) -> None:
    root = tmp_path / "proj"
    for i in range(7):
        (root / f"shard-{i}.bin").parent.mkdir(parents=True, exist_ok=True)
        (root / f"shard-{i}.bin").write_bytes(b"\0" * (200_000 * (i + 1)))
    write(root, "main.py")
    with pytest.raises(TooLarge) as caught:
        pack(root, tmp_path / "out", max_mib=1)
    message = str(caught.value)
    assert "5.3 MiB in 8 files, over the limit of 1 MiB (code.max_mib)" in message
    biggest = ["shard-6.bin", "shard-5.bin", "shard-4.bin", "shard-3.bin", "shard-2.bin"]
    positions = [message.index(name) for name in biggest]
    assert positions == sorted(positions)  # biggest first
    assert "shard-1.bin" not in message and "main.py" not in message
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


def test_unpack_round_trip_with_links_and_modes(tmp_path: Path) -> None:
    root = tmp_path / "proj"
    write(root, "run.sh", "#!/bin/sh\necho hi\n", mode=0o755)
    write(root, "pkg/mod.py", "X = 1\n")
    (root / "link.py").symlink_to("pkg/mod.py")
    archive = pack(root, tmp_path / "out")
    target = unpack(archive.path, tmp_path / "code" / archive.sha256, sha256=archive.sha256)
    assert (target / "pkg" / "mod.py").read_text() == "X = 1\n"
    assert os.access(target / "run.sh", os.X_OK) and not os.access(target / "pkg/mod.py", os.X_OK)
    assert (target / "link.py").is_symlink() and (target / "link.py").read_text() == "X = 1\n"
    # no staging folder left behind
    assert sorted(p.name for p in target.parent.iterdir()) == [archive.sha256]
    # a second unpack finds it there
    assert unpack(archive.path, target) == target


def _tar(tmp_path: Path, *members: tuple[str, str, str]) -> Path:
    """A tar.gz of (name, kind, payload): kind file (payload its text), sym or lnk (target)."""
    path = tmp_path / "evil.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name, kind, payload in members:
            info = tarfile.TarInfo(name)
            if kind == "file":
                data = payload.encode()
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                info.type = tarfile.SYMTYPE if kind == "sym" else tarfile.LNKTYPE
                info.linkname = payload
                tar.addfile(info)
    return path


@pytest.mark.parametrize(
    ("members", "why"),
    [
        ((("/etc/evil", "file", "x"),), "an absolute path"),
        ((("../evil", "file", "x"),), "'..' component"),
        ((("a/../../evil", "file", "x"),), "'..' component"),
        ((("link", "sym", "/etc/passwd"),), "a link to an absolute path"),
        ((("a/link", "sym", "../../outside"),), "a link out of the folder"),
        ((("hard", "lnk", "/etc/passwd"),), "a hard link"),
    ],
)
def test_unsafe_archives_are_refused_and_leave_nothing(
    tmp_path: Path, members: tuple[tuple[str, str, str], ...], why: str
) -> None:
    archive = _tar(tmp_path, ("ok.txt", "file", "fine"), *members)
    target = tmp_path / "code" / "x"
    with pytest.raises(UnsafeArchive, match=why):
        unpack(archive, target)
    assert not target.exists() and list((tmp_path / "code").iterdir()) == []
    assert not (tmp_path / "evil").exists()


def test_unpack_refuses_another_hash_and_a_file_that_is_no_archive(tmp_path: Path) -> None:
    root = tmp_path / "proj"
    write(root, "main.py")
    archive = pack(root, tmp_path / "out")
    with pytest.raises(BadArchive, match=f"expected {'0' * 64}"):
        unpack(archive.path, tmp_path / "a", sha256="0" * 64)
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"not gzip at all")
    with pytest.raises(BadArchive, match=r"not a readable tar\.gz"):
        unpack(junk, tmp_path / "b")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_packing_a_missing_folder_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(CodeError, match="not a folder"):
        pack(tmp_path / "nope", tmp_path / "out")
