"""The shared test helpers themselves: waiting fails loudly, the AWS tests stay offline with
fake credentials only."""

from __future__ import annotations

import ast
import socket
from pathlib import Path

import pytest

from tests.helpers import wait_until


def test_wait_until_returns_the_first_truthy_value() -> None:
    calls = iter([0, None, 7])
    assert wait_until(lambda: next(calls), timeout=1) == 7


def test_wait_until_fails_with_what_it_waited_for() -> None:
    with pytest.raises(AssertionError, match="the moon"):
        wait_until(lambda: False, timeout=0.02, what="the moon")


@pytest.mark.usefixtures("aws_env", "offline")
def test_no_test_can_reach_beyond_loopback() -> None:
    with pytest.raises(AssertionError, match="tried to reach"):
        socket.create_connection(("192.0.2.1", 443), timeout=0.01)


@pytest.mark.usefixtures("aws_env", "offline")
def test_fake_credentials_are_the_only_ones() -> None:
    import boto3

    credentials = boto3.session.Session().get_credentials()
    assert credentials is not None and credentials.access_key == "testing"


def test_shared_test_code_comes_from_tests_helpers_and_nothing_edits_sys_path() -> None:
    """Test modules and benches import shared code from tests.helpers (or tests.conftest's
    fixtures by name), never from another test module, and leave sys.path alone."""
    root = Path(__file__).resolve().parents[1]
    problems = []
    for path in sorted([*(root / "tests").rglob("*.py"), *(root / "bench").glob("*.py")]):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            where = f"{path.relative_to(root)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                names = []
            for name in names:
                if name.split(".")[0].startswith("test_") or name.startswith("tests.test_"):
                    problems.append(f"{where}: imports the test module {name}")
            if (
                isinstance(node, ast.Attribute)
                and node.attr == "path"
                and isinstance(node.value, ast.Name)
                and node.value.id == "sys"
            ):
                problems.append(f"{where}: uses sys.path")
    assert problems == []
