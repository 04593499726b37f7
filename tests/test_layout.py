"""The design card's import rules: providers and policies stay free of the store and daemon."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ALLOWED = {
    "providers": {
        "optimizer.model",
        "optimizer.hardware",
        "optimizer.catalog",
        "optimizer.common",
        "providers",
    },
    "policies": {"optimizer.model", "optimizer.hardware", "optimizer.common", "policies"},
}
FIRST_PARTY = ("optimizer", "providers", "policies")


def first_party_imports(path: Path) -> set[str]:
    """Modules a file imports from this project; `from a import b` counts as `a.b`."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        found.update(n for n in names if n.split(".")[0] in FIRST_PARTY)
    return found


def allowed_name(name: str, allowed: set[str]) -> bool:
    return any(name == a or name.startswith(a + ".") for a in allowed)


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_package_imports_only_what_the_design_allows(package: str) -> None:
    bad = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in sorted((ROOT / package).rglob("*.py"))
        for name in sorted(first_party_imports(path))
        if not allowed_name(name, ALLOWED[package])
    ]
    assert bad == []


def test_rule_catches_a_forbidden_import(tmp_path: Path) -> None:
    sample = tmp_path / "x.py"
    sample.write_text("from optimizer.store import Store\nfrom optimizer import hardware\n")
    names = first_party_imports(sample)
    assert names == {"optimizer.store.Store", "optimizer.hardware"}
    assert [n for n in names if not allowed_name(n, ALLOWED["providers"])] == [
        "optimizer.store.Store"
    ]
