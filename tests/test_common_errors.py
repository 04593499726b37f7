"""The one located-error type: every reader of a person-edited file raises it, printed alike."""

from __future__ import annotations

import pytest

from optimizer.catalog import CatalogError, parse_catalog
from optimizer.common.errors import LocatedError, Problem
from optimizer.daemon.config import ConfigError
from optimizer.jobs.spec import JobSpecError, parse_job_spec
from policies.loader import PolicyError, parse_policy


def test_a_problem_prints_as_file_line_column_field_message() -> None:
    assert (
        str(Problem("p.yaml", "must be > 0", 3, 7, "bid.max")) == "p.yaml:3:7: bid.max: must be > 0"
    )
    assert str(Problem("p.yaml", "no such file")) == "p.yaml: no such file"
    assert str(Problem("p.csv", "bad", line=2)) == "p.csv:2: bad"


def test_the_first_problem_is_readable_as_attributes() -> None:
    error = CatalogError.at("x.csv", "missing value", line=4, column=2, field="region")
    assert isinstance(error, LocatedError)
    assert (error.path, error.line, error.column, error.field) == ("x.csv", 4, 2, "region")
    assert error.message == "missing value"
    assert str(error) == "x.csv:4:2: region: missing value"
    assert error.problems == [Problem("x.csv", "missing value", 4, 2, "region")]


def test_an_error_without_a_problem_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one problem"):
        LocatedError([])


@pytest.mark.parametrize(
    ("read", "error"),
    [
        (lambda: parse_policy("name: [", path="p.yaml"), PolicyError),
        (lambda: parse_job_spec("name: [", path="p.yaml"), JobSpecError),
        (lambda: parse_catalog("nope\n", path="p.yaml"), CatalogError),
    ],
)
def test_every_file_reader_raises_the_one_type(read, error) -> None:
    with pytest.raises(error) as caught:
        read()
    assert isinstance(caught.value, LocatedError)
    assert str(caught.value).startswith("p.yaml:1")
    assert issubclass(ConfigError, LocatedError)
