"""The command line's help and errors as a person reads them, from the real `gpuopt` process:
help text joined into sentences that wrap to the terminal, no `<bool>` on flags, and every
complaint in one style, `gpuopt: error: …` with exit 2 (the command line's own too)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import run_gpuopt


def test_help_has_no_bool_metavar_and_no_sentence_broken_mid_line(tmp_path: Path) -> None:
    shown = run_gpuopt(tmp_path, "prices", "history", "--help", env={"COLUMNS": "200"})
    assert shown.returncode == 0, shown.stderr
    assert "<bool>" not in shown.stdout
    assert "--json " in shown.stdout  # the flag is there, without a type
    # The docstring's first paragraph (three lines in the source, broken elsewhere) is filled
    # to the width: up to 100 columns on a wide terminal, every line but its last full.
    paragraph = shown.stdout.split("\n\n")[1].splitlines()
    assert " ".join(line.strip() for line in paragraph).startswith(
        "The price points in effect for one pool, oldest first: raw observations where they "
        "are kept, hourly medians (with min, max and count) past the raw retention."
    )
    assert all(90 <= len(line) <= 100 for line in paragraph[:-1]), paragraph
    narrow = run_gpuopt(tmp_path, "prices", "history", "--help", env={"COLUMNS": "80"})
    assert max(len(line) for line in narrow.stdout.splitlines()) <= 80


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (
            ("jobs", "show"),
            "gpuopt: error: missing argument 'name' (see 'gpuopt jobs show --help')",
        ),
        (
            ("jobs", "list", "--bogus"),
            "gpuopt: error: no such option: --bogus (see 'gpuopt jobs list --help')",
        ),
        (("nosuch",), "gpuopt: error: no such command 'nosuch' (see 'gpuopt --help')"),
        (("offers", "--max-price", "abc"), "gpuopt: error: invalid value for '--max-price'"),
    ],
)
def test_the_command_lines_own_errors_are_in_gpuopts_style(
    tmp_path: Path, args: tuple[str, ...], said: str
) -> None:
    ran = run_gpuopt(tmp_path, *args)
    assert ran.returncode == 2
    assert ran.stderr.startswith(said), ran.stderr
    assert "Traceback" not in ran.stderr and "Usage:" not in ran.stderr
    assert len(ran.stderr.strip().splitlines()) == 1


def test_a_group_alone_still_shows_its_help(tmp_path: Path) -> None:
    ran = run_gpuopt(tmp_path, "jobs")
    assert ran.returncode == 2
    assert "Commands:" in ran.stdout + ran.stderr and "submit" in ran.stdout + ran.stderr
