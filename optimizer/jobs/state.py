"""What the daemon asks a job's checkpoint bucket at submit: its region.

`POST /jobs` fills in a spec's `checkpoint.region` when the user gave none, from the storage
API (`optimizer.storage.open_store(uri).region()`: S3's GetBucketLocation, GCS's bucket
location, None for a `file://` folder), so the costs of keeping and moving checkpoints are
known per region. The storage client is loaded only when a lookup is made, and the API takes
the lookup as a parameter (`ApiState.bucket_region`), so tests never reach a cloud.

Errors fall in two kinds: a bucket that does not exist, refuses the daemon's credentials or
cannot be named (`BucketRefused`: the submit is refused with a 422 naming `checkpoint.uri`,
since no attempt could sync to it either), and a storage API that could not be reached
(`BucketUnreachable`: the job is accepted with its region unknown and a `job.warning` event
says so; the agents on the cloud may reach what the daemon cannot).
"""

from __future__ import annotations

from collections.abc import Callable


class BucketError(Exception):
    """The bucket's region could not be read; the message names the URI and the reason."""


class BucketRefused(BucketError):
    """The bucket is missing, refuses access, or its URI cannot be used."""


class BucketUnreachable(BucketError):
    """The storage API could not be reached (after its retries)."""


RegionLookup = Callable[[str], "str | None"]


def bucket_region(uri: str) -> str | None:
    """The region of the bucket `uri` names (None: a `file://` folder, or one the storage API
    names no region for); raises BucketRefused or BucketUnreachable."""
    # A storage client is loaded for a lookup only.
    from optimizer.storage import StorageError, Unreachable, open_store

    try:
        region: str | None = open_store(uri).region()
    except Unreachable as exc:
        raise BucketUnreachable(str(exc)) from None
    except StorageError as exc:
        raise BucketRefused(str(exc)) from None
    return region


__all__ = ["BucketError", "BucketRefused", "BucketUnreachable", "RegionLookup", "bucket_region"]
