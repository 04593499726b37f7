"""What every command shares: how a command refuses bad input.

Bad input (a flag, a file, a config, a request the daemon refuses) ends a command with one
line per problem on stderr and exit status 2, never a traceback. Exit 1 is kept for a command
that ran and reports a failure (a failing probe, an error inside the daemon).
"""

from __future__ import annotations

import sys
from typing import NoReturn

import typer

BAD_INPUT = 2
PREFIX = "gpuopt: error: "


def error(message: object) -> None:
    """Print one `gpuopt: error: …` line on stderr."""
    print(f"{PREFIX}{message}", file=sys.stderr)


def fail(*problems: object, prefixed: bool = True) -> NoReturn:
    """Print each problem as one line on stderr, then exit 2.

    Usually one message; a located error passes its problems, one `file:line:col: field:
    message` each. `prefixed=False` prints them without `gpuopt: error: ` (the `check`
    commands list located problems bare, as editors and CI parse them).
    """
    for problem in problems:
        if prefixed:
            error(problem)
        else:
            print(problem, file=sys.stderr)
    raise typer.Exit(BAD_INPUT)
