"""Policy YAML to `Policy`, with every problem located as `file:line:col: field: message`.

The reading itself (safe YAML, `${VAR}` interpolation, positions, size and alias limits) is
the shared document loader, `optimizer.common.documents`; this module names what a policy is.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from optimizer.common.documents import load_document, parse_document
from optimizer.common.errors import LocatedError
from policies.schema import Policy


class PolicyError(LocatedError):
    """A policy file that cannot be used; `problems` lists every problem found."""


def parse_policy(
    text: str | bytes, *, path: str = "<policy>", environ: Mapping[str, str] | None = None
) -> Policy:
    """Parse one policy document; raises PolicyError listing every problem found."""
    return parse_document(
        text, Policy, path=path, environ=environ, what="policy", error=PolicyError
    )


def load_policy(path: str | Path, *, environ: Mapping[str, str] | None = None) -> Policy:
    """Read and parse one policy file; every failure is a PolicyError naming the file."""
    return load_document(path, Policy, environ=environ, what="policy", error=PolicyError)
