"""Sizes and durations as people read them."""

from __future__ import annotations

_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB")


def size_text(n: int) -> str:
    """Bytes in binary units, one decimal past bytes: `512 B`, `1.5 GiB`."""
    if n < 1024:
        return f"{n} B"
    size = float(n)
    for unit in _UNITS:
        size /= 1024
        if size < 1024 or unit == _UNITS[-1]:
            return f"{size:.1f} {unit}"
    raise AssertionError("unreachable")


def duration_text(seconds: float) -> str:
    """`5.2 h`, `42 min`, `30 s`; a negative span keeps its sign."""
    size = abs(seconds)
    if size >= 3600:
        return f"{seconds / 3600:.1f} h"
    if size >= 120:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"


__all__ = ["duration_text", "size_text"]
