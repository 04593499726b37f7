"""Policy YAML to `Policy`, with every problem located as `file:line:col: field: message`.

The reading itself (safe YAML, positions, size and alias limits) is the shared document
loader, `optimizer.common.documents`; this module names what a policy is. A policy takes
nothing from the environment: the API returns policies and many people edit them, so a `${`
in a value is a located error rather than a way to read the daemon's variables.
"""

from __future__ import annotations

from pathlib import Path

from optimizer.common.documents import load_document, parse_document
from optimizer.common.errors import LocatedError
from policies.schema import Policy


class PolicyError(LocatedError):
    """A policy file that cannot be used; `problems` lists every problem found."""


def parse_policy(text: str | bytes, *, path: str = "<policy>") -> Policy:
    """Parse one policy document; raises PolicyError listing every problem found."""
    return parse_document(
        text, Policy, path=path, interpolate=False, what="policy", error=PolicyError
    )


def load_policy(path: str | Path) -> Policy:
    """Read and parse one policy file; every failure is a PolicyError naming the file."""
    return load_document(path, Policy, interpolate=False, what="policy", error=PolicyError)
