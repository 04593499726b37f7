"""Sizes as people read them."""

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


__all__ = ["size_text"]
