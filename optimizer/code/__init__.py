"""Code archives: a job's folder packed where it is submitted, kept by the daemon once per
hash, and unpacked by the agent on the instance (docs/jobs.md, "Shipping code")."""

from optimizer.code.pack import (
    DEFAULT_MAX_MIB,
    MIB,
    Archive,
    CodeError,
    Entry,
    TooLarge,
    pack,
    sha256_file,
    walk,
)
from optimizer.code.store import HASH, CodeStore, key
from optimizer.code.unpack import BadArchive, UnsafeArchive, unpack

__all__ = [
    "DEFAULT_MAX_MIB",
    "HASH",
    "MIB",
    "Archive",
    "BadArchive",
    "CodeError",
    "CodeStore",
    "Entry",
    "TooLarge",
    "UnsafeArchive",
    "key",
    "pack",
    "sha256_file",
    "unpack",
    "walk",
]
