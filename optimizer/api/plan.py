"""The policy a submitted spec runs under, and `POST /jobs/plan`: what submitting it would do,
without launching anything (docs/api.md, "The plan").

A spec that names a policy and writes no `resources` runs under that loaded policy. One with
`resources`, or naming no policy, runs under its own effective policy: the resources written
over the policy it names, else the daemon's `policies.default`, else the default policy that
ships with gpuopt (policies/inline.py), named `job-<name>` (`inline_name`). `POST /jobs`
stores that policy's document with the job (optimizer/daemon/policies.py).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query

from optimizer import answers
from optimizer.api.state import ApiState, StateDep, utc_text
from optimizer.jobs.ranking import launch_ranking, with_expected
from optimizer.jobs.spec import JobSpec
from policies.inline import InlineError, document, inline_name, merge, shipped_default
from policies.schema import Policy

router = APIRouter(prefix="/jobs", tags=["jobs"])


def _refused(loc: list[str], msg: str) -> HTTPException:
    return HTTPException(422, detail=[{"loc": ["body", *loc], "msg": msg, "type": "value_error"}])


def _loaded_names(state: ApiState) -> str:
    return ", ".join(sorted(state.policies.snapshot())) or "none"


def effective_policy(state: ApiState, spec: JobSpec) -> tuple[str, Policy, str]:
    """The name the job's row carries, the policy it runs under and the name of the policy
    that is written over (the same for a plain named policy); a 422 located at the field
    otherwise (`policy`, `resources`, `name`)."""
    if not spec.inline:
        assert spec.policy is not None
        loaded = state.policies.get(spec.policy)
        if loaded is None:
            raise _refused(
                ["policy"],
                f"no policy named {spec.policy!r} is loaded (loaded: {_loaded_names(state)})",
            )
        return spec.policy, loaded.policy, spec.policy
    base_name = spec.policy or state.policies.default
    if base_name is None:
        base = shipped_default()
    else:
        found = state.policies.get(base_name)
        if found is None:
            where = "" if spec.policy else "the daemon's policies.default names it, but "
            raise _refused(
                ["policy"],
                f"{where}no policy named {base_name!r} is loaded (loaded: {_loaded_names(state)})",
            )
        base = found.policy
    name = inline_name(spec.name)
    if state.policies.get(name) is not None:
        raise _refused(
            ["name"],
            f"the job's own policy would be named {name!r}, and a loaded policy has that "
            "name: submit the job under another name",
        )
    try:
        return name, merge(base, spec.resources, name=name), base.name
    except InlineError as exc:
        raise _refused(["resources"], str(exc)) from None


@router.post("/plan", response_model=answers.PlanView)
def plan(
    spec: JobSpec,
    state: StateDep,
    limit: Annotated[int, Query(ge=1, le=100, description="At most this many offers.")] = 5,
) -> dict[str, Any]:
    """What submitting the spec would do, launching nothing: the policy it runs under (its
    document), the offers its first launch would walk best first (price, market, region,
    expected USD/h, and the expected cost to finish where the spec gives its `work`), how
    many offers each rule rejects, and notes (no checkpoint: it restarts from the
    beginning; its name is taken)."""
    name, policy, base = effective_policy(state, spec)
    now = state.clock()
    found = launch_ranking(state.store, name, policy, now, window=state.probe_window)
    ranking = found.ranking
    page = list(ranking.candidates[:limit])
    if page and page[0].expected_usd_per_hour is None:
        page = with_expected(state.store, name, page, now)
    nodes = spec.nodes or policy.workload.nodes
    candidates = []
    for c in page:
        row = c.to_dict()
        row["expected_usd_to_finish"] = _to_finish(spec, c.offer.instance_type, row, nodes)
        candidates.append(row)
    notes: list[str] = []
    if spec.restarts_from_beginning:
        notes.append(
            "no checkpoint or checkpoint_dir: after an interruption the job restarts from "
            "the beginning"
            + (
                ", and after a move too (the policy's migration is on)"
                if policy.migration.enabled
                else ""
            )
        )
    taken = state.store.jobs.get_job(spec.name)
    if taken is not None:
        notes.append(f"a job named {spec.name!r} exists ({taken.state}): a submit is refused")
    if not ranking.candidates:
        notes.append("no offer meets the policy now: the job would wait, pending")
    return {
        "job": spec.name,
        "policy": name,
        "base_policy": base,
        "inline": spec.inline,
        "effective_policy": document(policy),
        "evaluated_at": utc_text(now),
        "nodes": nodes,
        "work_hours": None if spec.work is None else spec.work.hours,
        "restarts_from_beginning": spec.restarts_from_beginning,
        "candidate_count": len(ranking.candidates),
        "candidates": candidates,
        "rejection_count": sum(ranking.rejection_counts().values()),
        "rejected_by_rule": ranking.rejection_counts(),
        "cooling_down": found.held_back,
        "notes": notes,
    }


def _to_finish(spec: JobSpec, instance_type: str, row: dict[str, Any], nodes: int) -> float | None:
    """The work's hours x the expected USD/h (else the price) x the nodes, where the spec
    gives its work in hours on this type (or on no named type); None otherwise."""
    work = spec.work
    if work is None or (work.reference is not None and work.reference != instance_type):
        return None
    per_hour = row.get("expected_usd_per_hour") or row["offer"]["usd_per_hour"]
    return round(work.hours * float(per_hour) * nodes, 2)
