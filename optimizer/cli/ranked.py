"""`gpuopt offers --policy`: a policy's ranking, from the daemon when one answers.

With a daemon, the answer is `GET /offers?policy=NAME`: the daemon's live offers ranked as
its next launch under that policy would walk them (pools in cooldown left out, the month's
spend in the budget rule). With none (or one without that policy loaded), the policy file is
ranked here over the offers this command gathered (the snapshot, a live cloud, the local
cloud), with a one-line note saying so. Either way the answer becomes a `RankingView`
(optimizer/cli/ranking_view.py), which the table and the JSON output are made from.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from optimizer.cli.client import NoDaemon, base_url, check, detail, request
from optimizer.cli.common import fail
from optimizer.cli.ranking_view import RankingView
from optimizer.clock import parse_utc, utc_text
from optimizer.model import Offer
from optimizer.offers import OfferQuery
from policies.engine import Ranking
from policies.schema import NAME_PATTERN, Policy

PAGE = 1000  # the API's largest page


@dataclass(frozen=True, slots=True)
class PolicyArg:
    """What `--policy` named: a policy file (loaded and checked here), or a loaded policy's
    name that only the daemon can rank."""

    name: str
    path: Path | None = None
    policy: Policy | None = None  # for ranking here
    sha256: str | None = None


def policy_arg(path: Path) -> PolicyArg:
    """Read `--policy`: a file's located problems end the command; a path that is no file
    but spells a policy name is that name, for the daemon."""
    from policies.loader import PolicyError, load_policy

    if not path.exists() and re.fullmatch(NAME_PATTERN, str(path)):
        return PolicyArg(str(path))
    try:
        loaded = load_policy(path)
    except PolicyError as exc:
        fail(*exc.problems)
    return PolicyArg(loaded.name, path, loaded, hashlib.sha256(path.read_bytes()).hexdigest())


def job_policy_arg(policy: Path | None) -> PolicyArg:
    """`--job` with or without `--policy`: the daemon ranks under the job's own policy, so
    a policy given must be that one (the daemon says so otherwise)."""
    return PolicyArg("") if policy is None else policy_arg(policy)


def show(
    arg: PolicyArg,
    query: OfferQuery,
    *,
    limit: int,
    explain: bool,
    as_json: bool,
    api: str | None,
    gather: Callable[[], tuple[list[Offer], str]],
    at: datetime | None = None,
    job: str | None = None,
    wide: bool = False,
) -> None:
    """Rank and print: the daemon's ranking when it answers, else this command's own; `at`:
    under the policy in force at that instant (its schedule window); `job`: as that job's
    next launch (the daemon only: the job's state is in its store)."""
    found = from_daemon(arg, query, limit=limit, explain=explain, api=api, at=at, job=job)
    if isinstance(found, tuple):
        view, source = found
    else:
        if job is not None:
            fail(f"--job {job}: the daemon ranks a job's launch, and none answered: {found}")
        if arg.policy is None:
            fail(f"--policy {arg.name}: no such file, and no daemon to rank it by name: {found}")
        offers, source = gather()
        note = f"{arg.path} ranked here (source: {source}), not by the daemon: {found}"
        print(f"gpuopt: {note}", file=sys.stderr)
        chosen = [o for o in offers if query.matches(o)]
        view = view_here(arg.policy, chosen, at=at)
    render(view, limit=limit, explain=explain, as_json=as_json, source=source, wide=wide)


def render(
    view: RankingView,
    *,
    limit: int,
    explain: bool,
    as_json: bool,
    source: str,
    wide: bool = False,
) -> None:
    """Print the ranking: a table (rejections by rule with `explain`), or JSON."""
    if as_json:
        json.dump(view.to_dict(limit=limit, explain=explain, source=source), sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    from optimizer.cli.tables import ranking_table

    ranking_table(view, limit=limit, explain=explain, source=source, wide=wide)


def evaluate_here(
    policy: Policy, offers: Iterable[Offer], *, at: datetime | None = None
) -> Ranking:
    """The engine's ranking of `offers` now, under the policy in force at `at` (default now)."""
    from dataclasses import replace

    from policies import per_step, risk
    from policies.engine import evaluate
    from policies.schedule import effective

    now = datetime.now(UTC)
    plain = effective(policy, at or now)
    ranking = evaluate(plain, list(offers), now)
    # No store here: each pool's p is its prior, the overhead the default (policies/risk.py).
    overhead = risk.Overhead(risk.DEFAULT_OVERHEAD_H, "default")
    annotated = risk.annotate_all(ranking.candidates, {}, overhead, now)
    if plain.rank_by == "expected_cost":
        annotated = risk.by_expected_cost(annotated)
    if plain.rank_by == "price_per_step":  # no job here: per TFLOP, and said so
        annotated = per_step.by_price_per_step(annotated, per_step.NOTHING, ranking.dtype)
    return replace(ranking, candidates=tuple(annotated))


def view_here(policy: Policy, offers: Iterable[Offer], *, at: datetime | None) -> RankingView:
    """The view of `evaluate_here`, saying which instant's policy and window ranked."""
    from dataclasses import replace

    from policies.schedule import window_at

    when = at or datetime.now(UTC)
    window = window_at(policy.schedule, when)
    view = RankingView.of(evaluate_here(policy, offers, at=when))
    stamp = utc_text(when)
    return replace(view, at=stamp, window=None if window is None else window.name)


def parse_at(text: str, *, option: str = "--at") -> datetime:
    """`--at`: an ISO 8601 instant with a UTC offset; anything else ends the command."""
    try:
        when = parse_utc(text)
    except ValueError:
        fail(f"{option} {text!r}: not an ISO 8601 time (2026-12-01T10:00:00+01:00)")
    if when.utcoffset() is None:
        fail(f"{option} {text!r}: give a UTC offset (+01:00, or Z for UTC)")
    return when


def from_daemon(
    arg: PolicyArg,
    query: OfferQuery,
    *,
    limit: int,
    explain: bool,
    api: str | None,
    at: datetime | None = None,
    job: str | None = None,
) -> tuple[RankingView, str] | str:
    """(the daemon's ranking, its source line), or why the daemon could not give one."""
    filtering = query != OfferQuery()
    # Filters select among the daemon's ranking here, so they need all of it; without them,
    # the candidates shown and, to explain, every rejection (the counts come whole anyway).
    want = None if filtering or not limit else limit
    every_rejection = filtering or explain
    answer: dict[str, Any] | None = None
    offset = 0
    while True:
        size = PAGE if want is None or every_rejection else min(PAGE, want)
        params: dict[str, Any] = {"limit": size, "offset": offset}
        if arg.name:  # with --job alone, the daemon takes the job's policy
            params["policy"] = arg.name
        if at is not None:
            params["at"] = at.isoformat()
        if job is not None:
            params["job"] = job
        try:
            response = request("GET", "/offers", api, params=params)
        except NoDaemon as exc:
            return str(exc)
        if response.status_code == 404 and offset == 0:
            if job is not None:
                fail(f"--job {job}: {detail(response)}")
            return f"the daemon at {base_url(api)} has no policy named {arg.name!r} loaded"
        page = check(response)
        if answer is None:
            answer = page
        else:
            answer["candidates"] += page["candidates"]
            answer["rejections"] += page["rejections"]
        offset += size
        more_candidates = offset < page["candidate_count"] and (
            want is None or len(answer["candidates"]) < want
        )
        more_rejections = every_rejection and offset < page["rejection_count"]
        if not (more_candidates or more_rejections):
            break
    assert answer is not None  # the loop ran at least once
    if not every_rejection:
        answer["rejections"] = []
    if arg.sha256 is not None and answer.get("policy_sha256") != arg.sha256:
        print(
            f"gpuopt: the daemon's policy {arg.name!r} is not the content of {arg.path}; "
            "showing the daemon's ranking, under the version it loaded",
            file=sys.stderr,
        )
    view = RankingView.from_api(answer)
    source = f"daemon at {base_url(api)}: live offers, ranked as a launch would"
    if job is not None:
        source = f"daemon at {base_url(api)}: live offers, ranked as job {job}'s next launch"
    return (view.select(query) if filtering else view), source
