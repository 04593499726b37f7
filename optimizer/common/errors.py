"""The one located-error type: every problem as `file:line:col: field: message`.

Every reader of a person-edited file (policies, the daemon config, job specs, the offer
catalog) raises a subclass of `LocatedError`, so callers print `problems` one per line and
tests read `line`, `column` and `field` the same way whatever the file was.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Self


@dataclass(frozen=True, slots=True)
class Problem:
    """One located problem; lines and columns count from 1, `field` is dotted (`a.b[0]`)."""

    path: str
    message: str
    line: int | None = None
    column: int | None = None
    field: str = ""

    def __str__(self) -> str:
        where = self.path
        if self.line is not None:
            where += f":{self.line}"
            if self.column is not None:
                where += f":{self.column}"
        what = f"{self.field}: " if self.field else ""
        return f"{where}: {what}{self.message}"


class LocatedError(ValueError):
    """A file that cannot be used; `problems` lists every problem found (at least one).

    The first problem's parts are also attributes (`path`, `line`, `column`, `field`,
    `message`) for readers that stop at the first bad value.
    """

    def __init__(self, problems: Iterable[Problem]) -> None:
        self.problems = list(problems)
        if not self.problems:
            raise ValueError("a LocatedError needs at least one problem")
        super().__init__("\n".join(str(p) for p in self.problems))

    @classmethod
    def at(
        cls,
        path: str,
        message: str,
        *,
        line: int | None = None,
        column: int | None = None,
        field: str = "",
    ) -> Self:
        """One problem at one place: `raise CatalogError.at("x.csv", "bad", line=3)`."""
        return cls([Problem(path, message, line, column, field)])

    @property
    def first(self) -> Problem:
        return self.problems[0]

    @property
    def path(self) -> str:
        return self.first.path

    @property
    def message(self) -> str:
        return self.first.message

    @property
    def line(self) -> int | None:
        return self.first.line

    @property
    def column(self) -> int | None:
        return self.first.column

    @property
    def field(self) -> str:
        return self.first.field
