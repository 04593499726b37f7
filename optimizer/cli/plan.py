"""The plan before the launch (docs/cli.md, "The plan"): `gpuopt jobs submit` and `gpuopt run`
ask the daemon what submitting the spec would do (`POST /jobs/plan`), print it, and on a
terminal ask "Launch? [Y/n]" (`-y` does not ask, `--dry-run` stops after the plan). Output
that is not a terminal is never asked anything: the plan is printed and the job submitted.

The plan goes to stdout with `--dry-run` (it is the answer then) and to stderr otherwise, so
a script's stdout holds the submitted job alone. `effective_policy_lines` words a policy
document (the plan's, and the `effective_policy` of `GET /jobs/{name}`) for `jobs show`.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import typer

from optimizer.cli.client import call
from optimizer.cli.code import ShipError, ship, shipping
from optimizer.cli.common import fail

if TYPE_CHECKING:
    from optimizer.answers import JobView

PLAN_OFFERS = 5


def _usd(value: Any, digits: int = 4) -> str:
    return "-" if value is None else f"${float(value):,.{digits}f}"


def plan_rows(plan: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The plan's offers as a table: rank, where (provider/zone, else region), market,
    price, expected USD/h, the expected cost to finish (only when the spec gives its work),
    GPUs and the instance type last (the column that wraps on a narrow terminal, so the
    prices are never cut)."""
    finish = plan.get("work_hours") is not None
    headers = ["#", "WHERE", "MARKET", "$/H", "EXP $/H"]
    headers += ["TO FINISH"] if finish else []
    headers += ["GPUS", "TYPE"]
    rows = []
    for c in plan.get("candidates", []):
        o = c.get("offer", {})
        row = [
            str(c.get("rank", "-")),
            f"{o.get('provider', '-')}/{o.get('zone') or o.get('region') or '-'}",
            str(o.get("market", "-")),
            _usd(o.get("usd_per_hour")),
            _usd(c.get("expected_usd_per_hour")),
        ]
        row += [_usd(c.get("expected_usd_to_finish"), 2)] if finish else []
        row += [
            f"{o.get('gpu_count', '-')}x{o.get('gpu_model', '?')}",
            str(o.get("instance_type", "-")),
        ]
        rows.append(row)
    return headers, rows


def plan_lines(plan: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The lines above the table and below it (rejections by rule, notes)."""
    over = (
        f"policy {plan['policy']} (inline resources over {plan['base_policy']})"
        if plan.get("inline")
        else f"policy {plan['policy']}"
    )
    head = [f"plan for job {plan['job']}: {over}"]
    head += ["  " + line for line in effective_policy_lines(plan.get("effective_policy") or {})]
    count = plan.get("candidate_count", 0)
    head.append(f"{count} offer{'s' if count != 1 else ''} fit, best first:" if count else "")
    tail = []
    rejected = plan.get("rejected_by_rule") or {}
    if rejected:
        tail.append(
            f"rejected: {plan.get('rejection_count', 0)} ("
            + ", ".join(f"{rule} {n}" for rule, n in rejected.items())
            + ")"
        )
    if plan.get("cooling_down"):
        tail.append(f"left out: {plan['cooling_down']} (their pools are cooling down)")
    if plan.get("work_hours") is None:
        tail.append("cost to finish: unknown (give the spec's `work` to see it)")
    tail += [f"note: {note}" for note in plan.get("notes", [])]
    return [line for line in head if line], tail


def effective_policy_header(job: JobView) -> str:
    """`effective policy job-train (inline resources over policy default):`."""
    doc = job.effective_policy or {}
    about = f" ({doc['description']})" if doc.get("description") else ""
    return f"effective policy {doc.get('name', job.policy)}{about}:"


def effective_policy_lines(doc: dict[str, Any]) -> list[str]:
    """A policy document in a few lines: what it runs on, where, at what price, its budget
    and recovery (`jobs show` and the plan print these)."""
    if not doc:
        return []
    work = doc.get("workload") or {}
    place = doc.get("placement") or {}
    bid = doc.get("bid") or {}
    gpus = f"{work.get('gpus', 1)} GPU{'s' if work.get('gpus', 1) != 1 else ''}"
    if work.get("gpu_models"):
        gpus += " (" + ", ".join(work["gpu_models"]) + ")"
    if work.get("nodes", 1) != 1:
        gpus += f" x {work['nodes']} nodes"
    if work.get("gpu_memory_gib"):
        gpus += f", {work['gpu_memory_gib']:g} GiB each"
    lines = [f"runs on: {gpus}; markets {', '.join(doc.get('markets') or [])}"]
    regions = (place.get("regions") or {}).get("allow") or ["*"]
    where = f"where: providers {', '.join(place.get('providers') or [])}; regions "
    where += ", ".join(regions)
    if place.get("compliance"):
        where += f"; compliance {place['compliance']}"
    lines.append(where)
    caps = []
    if bid.get("max_usd_per_hour") is not None:
        caps.append(f"${bid['max_usd_per_hour']:g}/h")
    if bid.get("max_usd_per_gpu_hour") is not None:
        caps.append(f"${bid['max_usd_per_gpu_hour']:g}/GPU-h")
    if bid.get("max_fraction_of_on_demand") is not None:
        caps.append(f"spot <= {bid['max_fraction_of_on_demand']:g} x on-demand")
    budget = (doc.get("budget") or {}).get("monthly_usd")
    money = f"bid: {' and '.join(caps) if caps else 'no cap'}"
    money += f"; budget ${budget:,.0f}/month" if budget else "; no budget"
    lines.append(money)
    recovery = doc.get("recovery") or {}
    migration = "on" if (doc.get("migration") or {}).get("enabled") else "off"
    lines.append(
        f"recovery: up to {recovery.get('max_restarts', 20)} restarts; migration {migration}"
    )
    return lines


def print_plan(plan: dict[str, Any], out: TextIO) -> None:
    """The plan, its offers through the shared table renderer."""
    from optimizer.cli.render import columns

    head, tail = plan_lines(plan)
    with _to(out):
        for line in head:
            print(line)
        headers, rows = plan_rows(plan)
        if rows:
            columns(headers, rows, right=["$/H", "EXP $/H", "TO FINISH"])
        for line in tail:
            print(line)


@contextlib.contextmanager
def _to(out: TextIO) -> Iterator[None]:
    if out is sys.stdout:
        yield
        return
    with contextlib.redirect_stdout(out):
        yield


def is_terminal() -> bool:
    """Whether a person can answer: stdin and stdout are both terminals."""
    return sys.stdin.isatty() and sys.stdout.isatty()


def ask(prompt: str = "Launch? [Y/n] ") -> bool:
    """Yes on Enter, y or yes; no on n or no; asked again otherwise; no at end of input."""
    while True:
        try:
            answer = input(prompt).strip().lower()
        except EOFError:
            return False
        if answer in ("", "y", "yes"):
            return True
        if answer in ("n", "no"):
            return False


def submit_planned(
    spec: Any,
    spec_file: Path,
    code: Path | None,
    api: str | None,
    *,
    yes: bool,
    dry_run: bool,
    as_json: bool,
    show_job: Callable[[dict[str, Any]], None],
    terminal: Callable[[], bool] = is_terminal,
) -> None:
    """Plan, ask where a person can answer, then ship the code and submit (docs/cli.md).
    On a terminal the plan comes before the question; elsewhere it is printed (on stderr)
    once the daemon took the job, so that a refusal's output is the refusal alone."""
    try:  # a code folder that is not there is refused before anything is asked
        shipping(spec.workdir, spec_file.resolve().parent, code)
    except ShipError as exc:
        fail(str(exc))
    body = spec.model_dump(mode="json", by_alias=True, exclude_none=True)
    plan = call("POST", "/jobs/plan", api, json=body, params={"limit": PLAN_OFFERS})
    if dry_run:
        if as_json:
            print(json.dumps(plan, indent=2))
        else:
            print_plan(plan, sys.stdout)
            print("dry run: nothing submitted")
        return
    asking = not yes and terminal()
    if asking or (yes and not as_json):
        print_plan(plan, sys.stderr)
    if asking and not ask():
        print("not submitted", file=sys.stderr)
        raise typer.Exit(1)
    spec = ship(spec, spec_file, code, api, out=sys.stderr if as_json else sys.stdout)
    answer = call("POST", "/jobs", api, json=spec.model_dump(mode="json", by_alias=True))
    if not asking and not yes and not as_json:
        print_plan(plan, sys.stderr)
    if as_json:
        print(json.dumps(answer, indent=2))
    else:
        show_job(answer)


def located(exc: Any, flags: dict[str, str]) -> list[str]:
    """A spec built from flags that does not validate: one problem per bad value, named by
    the flag that set it (`--max-price: must be greater than 0`)."""
    out = []
    for e in exc.errors(include_url=False):
        loc = [str(p) for p in e["loc"]]
        flag = flags.get(".".join(loc[:2])) or flags.get(loc[0] if loc else "") or ".".join(loc)
        out.append(f"{flag}: {str(e['msg']).removeprefix('Value error, ')}")
    return out
