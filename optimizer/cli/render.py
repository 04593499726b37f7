"""Tables that fit a terminal: one mechanism for every listing the CLI prints.

A table is a list of `Column`s and rows of text cells. At a given width it drops its least
important columns first (a `Column`'s `drop` rank: higher goes first, then the rightmost),
as long as the table would not fit even with its long text shortened, then shortens long
text cells with an ellipsis (only columns marked `cut`, the widest first, each down to its
`least`), until it fits.
Key columns (names, prices) are never dropped and never cut: a table whose key columns alone
are wider than the terminal runs past its edge rather than lose a digit. When something was
hidden or shortened, a note under the table says so and that `-o wide` shows it all.

The width: a terminal's own (which honours `COLUMNS`); piped output honours `COLUMNS` when it
is set, else it is printed in its wide form, every column, nothing cut (a script or a file
gets the whole table). `--wide` / `-o wide` asks for that form anywhere; `--json` prints the
data itself.
"""

from __future__ import annotations

import os
import shutil
import sys
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, TextIO

import typer

GAP = 2  # spaces between columns
ELLIPSIS = "…"
MIN_CUT = 12  # a shortened column keeps at least this many characters (or its header's)


@dataclass(frozen=True, slots=True)
class Column:
    """One column: its header, alignment, and how it gives way on a narrow terminal.

    `key`: never dropped nor cut (names, states, prices). `drop`: the order non-key columns
    are dropped in, higher first (ties: the rightmost first). `cut`: long cells may be
    shortened with an ellipsis (text such as reasons and notes; never a price or a name),
    down to `least` characters (or its header's width, if wider)."""

    header: str
    right: bool = False
    key: bool = False
    drop: int = 1
    cut: bool = False
    least: int = MIN_CUT


Row = Sequence[str]


class Output(StrEnum):
    wide = "wide"
    json = "json"


OutputOption = Annotated[
    Output | None,
    typer.Option(
        "--output",
        "-o",
        help="wide: every column, nothing cut; json: as --json.",
        show_default=False,
    ),
]
WideOption = Annotated[bool, typer.Option("--wide", help="Every column, nothing cut.")]


def wants_wide(output: Output | str | None, wide: bool) -> bool:
    return wide or output == "wide"


def target_width(*, wide: bool = False, stream: TextIO | None = None) -> int | None:
    """The width to fit, or None for the wide form: `--wide`, or piped with no `COLUMNS`."""
    if wide:
        return None
    out = stream or sys.stdout
    try:
        tty = out.isatty()
    except (AttributeError, ValueError):
        tty = False
    if tty:
        return shutil.get_terminal_size().columns
    given = os.environ.get("COLUMNS", "").strip()
    return int(given) if given.isdigit() and int(given) > 0 else None


@dataclass(frozen=True, slots=True)
class Fitted:
    """A table laid out: the columns kept (their indices), each one's width, the headers of
    the columns dropped, and whether any cell was shortened."""

    shown: list[int]
    widths: list[int]
    hidden: list[str]
    cut: bool


def _natural(column: Column, index: int, rows: Sequence[Row]) -> int:
    cells = (line for row in rows for line in row[index].split("\n"))
    return max([len(column.header), *(len(c) for c in cells)])


def fit(columns: Sequence[Column], rows: Sequence[Row], width: int | None) -> Fitted:
    """Lay the table out in `width` characters (None: no limit): drop the least important
    columns while even the shortest layout is too wide, then shorten `cut` columns, the
    widest first, until it fits or they are at their minimum."""
    natural = [_natural(c, i, rows) for i, c in enumerate(columns)]
    floor = [
        min(natural[i], max(c.least, len(c.header))) if c.cut and not c.key else natural[i]
        for i, c in enumerate(columns)
    ]
    shown = list(range(len(columns)))

    def total(widths: Sequence[int]) -> int:
        return sum(widths[i] for i in shown) + GAP * max(0, len(shown) - 1)

    if width is None:
        return Fitted(shown, [natural[i] for i in shown], [], False)
    droppable = sorted(
        (i for i, c in enumerate(columns) if not c.key),
        key=lambda i: (columns[i].drop, i),
        reverse=True,
    )
    hidden: list[int] = []
    for i in droppable:
        if total(floor) <= width:
            break
        shown.remove(i)
        hidden.append(i)
    widths = list(natural)
    while total(widths) > width:
        cuttable = [i for i in shown if widths[i] > floor[i]]
        if not cuttable:
            break
        widest = max(cuttable, key=lambda i: (widths[i], i))
        widths[widest] -= 1
    cut = any(widths[i] < natural[i] for i in shown)
    return Fitted(
        shown, [widths[i] for i in shown], [columns[i].header for i in sorted(hidden)], cut
    )


def _cell(text: str, width: int, right: bool) -> str:
    if len(text) > width:
        text = text[: max(0, width - 1)] + ELLIPSIS
    return text.rjust(width) if right else text.ljust(width)


def render_lines(
    columns: Sequence[Column],
    rows: Sequence[Row],
    *,
    width: int | None,
    title: str | None = None,
    footer: Sequence[Row] = (),
) -> list[str]:
    """The table's lines at `width` (None: the wide form): the title (filled to the width),
    the headers, the rows (a cell may hold several lines), a rule and the `footer` rows (a
    totals row), then a note when columns were hidden or cells shortened. No line carries
    trailing spaces."""
    fitted = fit(columns, [*rows, *footer], width)
    out: list[str] = []
    if title:
        out += textwrap.wrap(title, width) if width else [title]

    def line(cells: Sequence[str]) -> None:
        parts = [
            _cell(cells[i], w, columns[i].right)
            for i, w in zip(fitted.shown, fitted.widths, strict=True)
        ]
        out.append((" " * GAP).join(parts).rstrip())

    def row_lines(row: Row) -> None:
        split = [cell.split("\n") for cell in row]
        for n in range(max(len(s) for s in split)):
            line([s[n] if n < len(s) else "" for s in split])

    line([c.header for c in columns])
    for row in rows:
        row_lines(row)
    if footer:
        out.append("-" * (sum(fitted.widths) + GAP * max(0, len(fitted.widths) - 1)))
        for row in footer:
            row_lines(row)
    note = hidden_note(fitted, width)
    if note:
        out += _wrap(note, width)
    return out


def _wrap(text: str, width: int | None) -> list[str]:
    """The text filled to `width`, never broken inside `-o wide`."""
    if not width:
        return [text]
    kept = text.replace("-o wide", "-o\u00a0wide")
    return [line.replace("\u00a0", " ") for line in textwrap.wrap(kept, width)]


def hidden_note(fitted: Fitted, width: int | None) -> str | None:
    """`(2 columns hidden to fit 80 columns: zone, vCPUs; -o wide shows all)`."""
    parts = []
    if fitted.hidden:
        n = len(fitted.hidden)
        parts.append(
            f"{n} column{'s' if n > 1 else ''} hidden to fit {width} columns: "
            + ", ".join(fitted.hidden)
        )
    if fitted.cut:
        parts.append(f"long text shortened with {ELLIPSIS}")
    if not parts:
        return None
    return f"({'; '.join(parts)}; -o wide shows all)"


def table(
    columns: Sequence[Column],
    rows: Sequence[Row],
    *,
    title: str | None = None,
    footer: Sequence[Row] = (),
    wide: bool = False,
    out: TextIO | None = None,
) -> None:
    """Print a table fitted to the terminal (see the module's docstring)."""
    stream = out or sys.stdout
    width = target_width(wide=wide, stream=stream)
    for text in render_lines(columns, rows, width=width, title=title, footer=footer):
        print(text, file=stream)


def say(text: str, *, wide: bool = False, indent: str = "", hang: bool = False) -> None:
    """A line of prose beside a table, filled to the width a table would fit (whole when
    piped without COLUMNS, or wide); `indent` starts each line, and `hang` indents the
    lines after the first two spaces more."""
    width = target_width(wide=wide)
    if width is None:
        print(indent + text)
        return
    lines = textwrap.wrap(
        text,
        width,
        initial_indent=indent,
        subsequent_indent=indent + "  " if hang else indent,
        break_long_words=False,  # a path or a URI stays whole, past the edge if it must
        break_on_hyphens=False,
    )
    for line in lines or [indent.rstrip()]:
        print(line)


def columns(
    headers: Sequence[str | Column],
    rows: Sequence[Sequence[str]],
    *,
    right: Sequence[str] = (),
    keys: Sequence[str] = (),
    title: str | None = None,
    wide: bool = False,
) -> None:
    """Rows under headers in aligned columns without borders (a listing, as `kubectl get`
    prints one), fitted as `table` fits: headers given as text are columns that are dropped
    from the right (`keys` never), the last one shortened rather than dropped; a `Column`
    says for itself."""
    spec = [
        h
        if isinstance(h, Column)
        else Column(
            h,
            right=h in right,
            key=h in keys or i == 0,
            cut=i == len(headers) - 1,
            drop=0 if i == len(headers) - 1 else 1,
        )
        for i, h in enumerate(headers)
    ]
    table(spec, rows, title=title, wide=wide)
