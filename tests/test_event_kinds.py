"""Event kinds: one registry (`EventKind`), one spelling (`noun.verb`), every kind documented.

Emitters are typed to take `EventKind` members (mypy holds them to it); the scan below makes
sure no module spells a kind as a bare string instead, so the registry is every kind the
code can emit, and docs/alerts.md must list exactly the registry.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from optimizer.alerts.channel import TITLES, title_for
from optimizer.model import LEGACY_EVENT_KINDS, EventKind, event_kind, legacy_names

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "alerts.md"
NOUN_VERB = re.compile(r"[a-z]+(_[a-z]+)*\.[a-z]+(_[a-z]+)*")
SOURCES = ("optimizer", "policies", "providers")
REGISTRY = ROOT / "optimizer" / "model.py"
MIGRATIONS = ROOT / "optimizer" / "store" / "migrations"


def documented() -> dict[str, str]:
    """The 'Every event kind' table: kind -> its earlier name ('' when it had none)."""
    section = DOC.read_text().split("## Every event kind", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, str] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0].startswith("`"):
            assert cells[0] not in rows, f"{cells[0]} is listed twice"
            rows[cells[0].strip("`")] = cells[4].strip("`")
    return rows


def test_every_kind_is_spelled_noun_dot_verb() -> None:
    bad = [k.value for k in EventKind if not NOUN_VERB.fullmatch(k.value)]
    assert bad == []


def test_docs_list_exactly_the_kinds_the_code_has_with_their_earlier_names() -> None:
    rows = documented()
    assert sorted(rows) == sorted(k.value for k in EventKind)
    assert {old: new for new, old in rows.items() if old} == {
        old: new.value for old, new in LEGACY_EVENT_KINDS.items()
    }


def test_every_kind_has_a_title_for_people() -> None:
    assert set(TITLES) == set(EventKind)
    assert title_for("price_drop") == title_for(EventKind.PRICE_DROPPED) == "Best offer got cheaper"
    assert title_for("someone.else_happened") == "Someone else happened"


def test_earlier_spellings_map_to_todays_kinds_and_are_none_of_them() -> None:
    assert not set(LEGACY_EVENT_KINDS) & {k.value for k in EventKind}
    assert event_kind("price_drop") == "price.dropped"
    assert event_kind("job.failed") == "job.failed" and event_kind("other") == "other"
    assert legacy_names(EventKind.JOB_STATE_CHANGED) == ("job.state",)
    assert legacy_names(EventKind.JOB_FAILED) == ()


def spelled_kinds(path: Path, root: Path = ROOT) -> list[str]:
    """String constants in a module that are a kind's name, today's or an earlier one."""
    names = {k.value for k in EventKind} | set(LEGACY_EVENT_KINDS)
    tree = ast.parse(path.read_text(), filename=str(path))
    return [
        f"{path.relative_to(root)}:{node.lineno}: {node.value!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names
    ]


def test_no_module_spells_a_kind_as_a_string() -> None:
    found = [
        hit
        for package in SOURCES
        for path in sorted((ROOT / package).rglob("*.py"))
        if path != REGISTRY and MIGRATIONS not in path.parents
        for hit in spelled_kinds(path)
    ]
    assert found == []


def test_the_scan_finds_a_kind_spelled_out(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text('emitter.draft("job.failed", "m")\nemitter.draft("price_drop", "m")\n')
    assert spelled_kinds(sample, tmp_path) == [
        "sample.py:1: 'job.failed'",
        "sample.py:2: 'price_drop'",
    ]
