"""The local cloud for tests: started, and every instance it launched powered off after."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from providers.local import LocalCloud


@contextmanager
def local_cloud(state_dir: Path, **kwargs: Any) -> Iterator[LocalCloud]:
    """A started LocalCloud on `state_dir` (`kwargs` go to LocalCloud); on the way out every
    instance it holds is powered off and its endpoint and ticker stop."""
    cloud = LocalCloud(state_dir, **kwargs)
    cloud.start()
    try:
        yield cloud
    finally:
        cloud.kill_all()
        cloud.close()
