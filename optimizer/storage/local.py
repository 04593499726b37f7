"""file:// stores: plain files under a folder, each written to a temporary name and renamed."""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from optimizer.storage.base import ObjectInfo, download_via_tmp, source_file
from optimizer.storage.errors import AccessDenied, NotFound, StorageError
from optimizer.storage.location import Location, check_key

TMP_MARK = ".gpuopt-tmp-"  # in-flight writes: `.<name>.gpuopt-tmp-<hex>`, never listed


class FileStore:
    """Objects as files under the folder `location.prefix`; keys are relative paths."""

    def __init__(self, location: Location) -> None:
        self.location = location
        self.root = Path("/" + location.prefix.strip("/"))

    def _path(self, key: str) -> tuple[Path, str]:
        key = check_key(key, self.location)
        return self.root / key, str(self.location.join(key))

    def _write(self, key: str, write: Callable[[Path], object]) -> None:
        target, uri = self._path(key)
        with _mapped(uri):
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f".{target.name}{TMP_MARK}{uuid.uuid4().hex}")
            try:
                write(tmp)
                os.replace(tmp, target)
            except BaseException:
                with contextlib.suppress(OSError):
                    tmp.unlink()
                raise

    def put_file(self, key: str, path: Path) -> None:
        source = source_file(path, str(self.location))
        self._write(key, lambda tmp: shutil.copyfile(source, tmp))

    def put_bytes(self, key: str, data: bytes) -> None:
        self._write(key, lambda tmp: tmp.write_bytes(data))

    def get_file(self, key: str, path: Path) -> None:
        source, uri = self._path(key)
        with _mapped(uri):
            download_via_tmp(Path(path), lambda tmp: shutil.copyfile(source, tmp))

    def get_bytes(self, key: str) -> bytes:
        source, uri = self._path(key)
        with _mapped(uri):
            return source.read_bytes()

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        found = []
        with _mapped(str(self.location)):
            for folder, dirs, files in os.walk(self.root):
                dirs.sort()
                base = Path(folder).relative_to(self.root).as_posix()
                for name in files:
                    if TMP_MARK in name:
                        continue
                    key = name if base == "." else f"{base}/{name}"
                    if key.startswith(prefix):
                        found.append(ObjectInfo(key, (Path(folder) / name).stat().st_size))
        return sorted(found, key=lambda o: o.key)

    def delete(self, keys: Iterable[str]) -> None:
        for key in keys:
            target, uri = self._path(key)
            with _mapped(uri):
                try:
                    target.unlink()
                except FileNotFoundError:
                    continue
                # Folders emptied by the delete go too, as there are no folders in a bucket.
                parent = target.parent
                while parent != self.root and self.root in parent.parents:
                    try:
                        parent.rmdir()
                    except OSError:
                        break
                    parent = parent.parent

    def region(self) -> str | None:
        return None


@contextlib.contextmanager
def _mapped(uri: str) -> Iterator[None]:
    """OS errors as storage errors naming `uri`."""
    try:
        yield
    except StorageError:
        raise
    except FileNotFoundError as exc:
        raise NotFound(f"{uri}: not found") from exc
    except IsADirectoryError as exc:
        raise NotFound(f"{uri}: not found (a folder, not an object)") from exc
    except PermissionError as exc:
        raise AccessDenied(f"{uri}: access denied ({exc.strerror})") from exc
    except OSError as exc:
        raise StorageError(f"{uri}: {exc.strerror or exc}") from exc
