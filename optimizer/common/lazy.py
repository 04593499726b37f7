"""A module imported when first read: numpy for the ranking engine, which an idle daemon with
no policy in force never runs (bench/daemon.py measures the memory this keeps).

A module that ranks writes, so type checkers still see the real module:

    if TYPE_CHECKING:
        import numpy as np
    else:
        from optimizer.common.lazy import numpy as np

and reads `np.` attributes only inside functions: a read at import time imports it.
"""

from __future__ import annotations

import importlib
from typing import Any


class LazyModule:
    """Stands for the module `name`; the first attribute read imports it (under the import
    lock, so two threads get one module) and copies its names here, so later reads are
    plain lookups."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):  # copy, pickle and inspect ask for these: not a use
            raise AttributeError(attr)
        module = importlib.import_module(self._name)
        vars(self).update(vars(module))
        return getattr(module, attr)

    def __repr__(self) -> str:
        return f"<lazy module {self._name!r}>"


numpy = LazyModule("numpy")
