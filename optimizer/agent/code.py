"""The job's code on the instance: the archive fetched from the daemon, its SHA-256 checked,
unpacked once per disk into `<code root>/<sha256>/` (a later attempt on the same disk finds
it there and fetches nothing)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from optimizer.agent.reporter import DaemonClient, DaemonError
from optimizer.code import CodeError, sha256_file, unpack
from optimizer.common.retry import Backoff
from optimizer.protocol import CodeArchive

log = logging.getLogger(__name__)

FETCH_TRIES = 6  # with the back-off's default pacing, about half a minute of retries


class CodeUnavailable(Exception):
    """The job's code could not be fetched or unpacked; the message says why."""


class Interrupted(Exception):
    """A stop or a signal came while the code was being fetched."""


def code_folder(root: Path, code: CodeArchive) -> Path:
    return root / code.sha256


def prepare(
    client: DaemonClient,
    code: CodeArchive,
    root: Path,
    *,
    backoff: Backoff | None = None,
    wait: Callable[[float], bool] = lambda _s: True,
    tries: int = FETCH_TRIES,
) -> Path:
    """The folder holding the job's code, fetched and unpacked unless already there.
    Transient failures are retried `tries` times with the back-off (`wait(delay)` returns
    False to give up at once: Interrupted); CodeUnavailable after that."""
    folder = code_folder(root, code)
    if folder.is_dir():
        log.info("code sha256:%s already on this disk: %s", code.sha256[:12], folder)
        return folder
    root.mkdir(parents=True, exist_ok=True)
    archive = root / f".{code.sha256}.tar.gz.part"
    backoff = backoff or Backoff()
    problem = "not tried"
    try:
        for attempt in range(1, tries + 1):
            try:
                client.download(code.url, archive)
                found = sha256_file(archive)
                if found != code.sha256:
                    raise DaemonError(
                        f"the archive fetched has sha256 {found}, not {code.sha256}",
                        retryable=True,
                    )
                unpack(archive, folder)  # its hash checked just above
                log.info("code sha256:%s unpacked into %s", code.sha256[:12], folder)
                return folder
            except CodeError as exc:
                raise CodeUnavailable(
                    f"cannot unpack code sha256:{code.sha256[:12]}: {exc}"
                ) from None
            except DaemonError as exc:
                problem = str(exc)
                if not exc.retryable or attempt == tries:
                    break
                delay = backoff.next()
                log.warning("fetching the code failed (%s); retrying in %.1f s", exc, delay)
                if not wait(delay):
                    raise Interrupted() from None
            except OSError as exc:
                raise CodeUnavailable(
                    f"cannot write code sha256:{code.sha256[:12]} into {root}: {exc}"
                ) from None
    finally:
        archive.unlink(missing_ok=True)
    raise CodeUnavailable(f"cannot fetch code sha256:{code.sha256[:12]} from the daemon: {problem}")
