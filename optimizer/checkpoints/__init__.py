"""Checkpoints that follow the job: the convention on the instance's disk, their upload to
object storage and their restore on the next instance (docs/checkpoints.md).

The job commits a checkpoint folder by writing `MARKER` into it last (`commit`, or
`gpuopt checkpoint commit DIR`); the agent's `Uploader` sends committed folders to the job's
checkpoint location, manifest last, and `restore` brings back the newest complete one.
"""

from optimizer.checkpoints.convention import MARKER, CheckpointError, commit
from optimizer.checkpoints.manifest import FileEntry, Manifest, list_checkpoints
from optimizer.checkpoints.restore import NoSpace, Restore, prefetch, restore
from optimizer.checkpoints.upload import Commit, Uploader

__all__ = [
    "MARKER",
    "CheckpointError",
    "Commit",
    "FileEntry",
    "Manifest",
    "NoSpace",
    "Restore",
    "Uploader",
    "commit",
    "list_checkpoints",
    "prefetch",
    "restore",
]
