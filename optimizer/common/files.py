"""Folders and files only their owner may read, whatever the umask.

`mkdir(mode=0o700)` and `open(..., 0o600)` only take bits away from the umask's result, and
`mkdir(parents=True)` gives the parents it creates the default mode: each folder or file
created here is set to its mode afterwards, explicitly. One that exists already keeps the
mode its owner gave it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO

DIR_MODE = 0o700
FILE_MODE = 0o600


def private_dir(path: Path) -> Path:
    """Create `path` and its missing parents, each one 0700; returns `path`."""
    missing: list[Path] = []
    folder = Path(path)
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    for created in reversed(missing):
        try:
            created.mkdir(mode=DIR_MODE)
        except FileExistsError:
            continue  # made meanwhile by someone else: theirs, with their mode
        os.chmod(created, DIR_MODE)
    if not Path(path).is_dir():
        raise NotADirectoryError(f"{path}: exists and is not a folder")
    return Path(path)


def append_private(path: Path) -> BinaryIO:
    """`path` opened to append bytes; created 0600 when it does not exist yet."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, FILE_MODE)
    except FileExistsError:
        fd = os.open(path, flags)
    else:
        os.fchmod(fd, FILE_MODE)
    return os.fdopen(fd, "ab")
