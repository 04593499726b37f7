"""The storage errors: every backend's failures become one of these at the boundary."""

from __future__ import annotations


class StorageError(Exception):
    """A storage operation failed; the message names the URI (or bucket) and what went wrong.

    `retryable` marks failures worth another try (unreachable endpoint, 5xx, throttling).
    """

    retryable = False

    def __init__(self, message: str, *, retryable: bool | None = None) -> None:
        super().__init__(message)
        if retryable is not None:
            self.retryable = retryable


class NotFound(StorageError):
    """The object or bucket does not exist."""


class AccessDenied(StorageError):
    """The credentials are missing, wrong, or not allowed to do this."""


class Unreachable(StorageError):
    """The storage endpoint could not be reached (connection refused, timed out, reset)."""

    retryable = True


class BadUri(StorageError):
    """A URI (or key) that cannot be used; the message names the problem."""
