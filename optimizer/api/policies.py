"""/policies: what is in force, from which file, and the files currently rejected."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException

from optimizer import answers
from optimizer.api.state import StateDep, utc_text

router = APIRouter(prefix="/policies", tags=["policies"])


@router.get("", response_model=answers.PolicyList)
def list_policies(state: StateDep) -> dict[str, Any]:
    """Policies in force (status active, file_invalid or file_deleted) and rejected files."""
    return {
        "policies": [p.summary() for _, p in sorted(state.policies.snapshot().items())],
        "rejected_files": [
            {"path": r.path, "sha256": r.sha256, "problems": list(r.problems), "kept": r.kept}
            for _, r in sorted(state.policies.rejected().items())
        ],
    }


@router.get("/{name}", response_model=answers.PolicyDetail)
def show_policy(name: str, state: StateDep) -> dict[str, Any]:
    """One policy: its summary, its content as validated, and its recent versions."""
    loaded = state.policies.get(name)
    if loaded is None:
        raise HTTPException(404, detail=f"no policy named {name!r} is loaded")
    versions = [
        {
            "id": v.id,
            "path": v.path,
            "sha256": v.sha256,
            "outcome": v.outcome,
            "at": utc_text(v.at),
            "problems": v.problems,
        }
        for v in state.store.policies.policy_versions(name)
    ]
    return {
        **loaded.summary(),
        "spec": loaded.policy.model_dump(mode="json", by_alias=True),
        "versions": versions,
    }
