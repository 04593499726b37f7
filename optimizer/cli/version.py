"""`gpuopt version`."""

from __future__ import annotations

from optimizer import __version__


def version() -> None:
    """Print the gpuopt version."""
    print(__version__)
