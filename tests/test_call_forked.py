"""`call_forked`: a call run in a forked child, its answer or its error brought back, and what
the child imported left out of this process (optimizer/common/procs.py)."""

from __future__ import annotations

import importlib
import os
import sys

import pytest

from optimizer.common.procs import call_forked
from optimizer.store.migrate import SchemaError


def test_the_answer_comes_back_from_another_process() -> None:
    assert call_forked(os.getpid) != os.getpid()
    assert call_forked(lambda: {"rows": [1, 2]}) == {"rows": [1, 2]}


def test_the_error_comes_back_as_raised() -> None:
    def refuse() -> None:
        raise SchemaError("the database is at revision 0099")

    with pytest.raises(SchemaError, match="revision 0099"):
        call_forked(refuse)


def test_an_error_that_cannot_be_pickled_comes_back_by_name() -> None:
    class Local(Exception):  # a local class cannot be pickled
        pass

    def fail() -> None:
        raise Local("no luck")

    with pytest.raises(RuntimeError, match="Local: no luck"):
        call_forked(fail)


def test_what_the_child_imports_stays_in_the_child() -> None:
    assert "tabnanny" not in sys.modules  # a module nothing here imports
    assert call_forked(lambda: importlib.import_module("tabnanny").__name__) == "tabnanny"
    assert "tabnanny" not in sys.modules
