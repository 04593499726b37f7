"""Storage URIs: `s3://bucket/prefix`, `gs://bucket/prefix`, `file:///absolute/path`."""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass

from optimizer.storage.errors import BadUri

SCHEMES = ("s3", "gs", "file")
# S3: 3-63 of lowercase letters, digits, dots and hyphens (also the rule GCS applies to names
# without dots); GCS allows underscores and dotted names up to 222 characters. Sources: the S3
# "Bucket naming rules" and Cloud Storage "Bucket names" pages.
_BUCKET = {
    "s3": re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$"),
    "gs": re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$"),
}


@dataclass(frozen=True)
class Location:
    """Where a store lives. `prefix` has no leading or trailing "/", except for `file`, where
    it is the absolute path ("/data/ckpt") and `bucket` is ""."""

    scheme: str
    bucket: str
    prefix: str

    def __str__(self) -> str:
        if self.scheme == "file":
            return "file://" + "/" + self.prefix.strip("/")
        return f"{self.scheme}://{self.bucket}/{self.prefix}".rstrip("/")

    def join(self, key: str) -> Location:
        """This location with `key` appended to its prefix (`key` is checked like any key)."""
        key = check_key(key, self)
        if self.scheme == "file":
            return Location("file", "", f"/{self.prefix.strip('/')}/{key}".replace("//", "/"))
        return Location(self.scheme, self.bucket, f"{self.prefix}/{key}".lstrip("/"))


def check_key(key: str, where: Location | str) -> str:
    """`key` without surrounding slashes; BadUri when it is empty or holds "." / ".." / ""
    segments (they would escape or alias a path on the file backend)."""
    if not isinstance(key, str):
        raise BadUri(f"{where}: key {key!r} is not a string")
    stripped = key.strip("/")
    if not stripped:
        raise BadUri(f"{where}: empty key {key!r}")
    bad = [s for s in stripped.split("/") if s in ("", ".", "..")]
    if bad or "\x00" in stripped:
        raise BadUri(f"{where}: key {key!r} has an empty, '.' or '..' segment")
    return stripped


def parse_uri(text: str) -> Location:
    """The Location a URI names; BadUri naming the problem when it cannot be used."""
    if not isinstance(text, str) or not text.strip():
        raise BadUri(f"empty storage URI {text!r}")
    raw = text.strip()
    scheme, sep, rest = raw.partition("://")
    if not sep:
        raise BadUri(
            f"{raw!r}: not a storage URI (expected s3://bucket/prefix, gs://bucket/prefix "
            "or file:///absolute/path)"
        )
    scheme = scheme.lower()
    if scheme not in SCHEMES:
        raise BadUri(f"{raw!r}: unsupported scheme {scheme!r} (use one of s3, gs, file)")
    if scheme == "file":
        return _parse_file(raw, rest)
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise BadUri(f"{raw!r}: no bucket name after {scheme}://")
    if not _BUCKET[scheme].match(bucket) or ".." in bucket:
        raise BadUri(
            f"{raw!r}: {bucket!r} is not a valid bucket name (lowercase letters, digits, "
            "'.', '-'" + (", '_'" if scheme == "gs" else "") + "; 3 to 63 characters)"
        )
    if "?" in prefix or "#" in prefix:
        raise BadUri(f"{raw!r}: query strings and fragments are not part of a storage URI")
    prefix = prefix.strip("/")
    if prefix:
        check_key(prefix, raw)
    return Location(scheme, bucket, prefix)


def _parse_file(raw: str, rest: str) -> Location:
    host, slash, path = rest.partition("/")
    if host not in ("", "localhost"):
        raise BadUri(
            f"{raw!r}: file URIs name a local path: file:///absolute/path (found host {host!r}; "
            "a relative path is not allowed)"
        )
    if not slash or not path.strip("/"):
        raise BadUri(f"{raw!r}: no path after file:// (expected file:///absolute/path)")
    normal = posixpath.normpath("/" + path)
    if normal != "/" + path.rstrip("/") and normal != "/" + path.strip("/"):
        raise BadUri(f"{raw!r}: the path has '.', '..' or empty segments; write it plainly")
    return Location("file", "", normal.rstrip("/"))
