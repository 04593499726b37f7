"""The console's pages and the data endpoints their scripts poll, all behind the session
cookie (auth.py). Pages are rendered on the server; a page's live part is a fragment that
console.js fetches again every few seconds (`data-refresh`), and charts read JSON from
`/ui/data/...` (uPlot draws them in the browser)."""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import (
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
)
from starlette.concurrency import run_in_threadpool

from optimizer.api.state import ApiState, StateDep
from optimizer.lifecycle import TERMINAL_JOB_STATES, JobState
from optimizer.model import Market
from optimizer.store import JobRecord
from optimizer.ui import gpu_prices as gpu_views
from optimizer.ui import jobs as job_views
from optimizer.ui import prices as price_views
from optimizer.ui import session as sessions
from optimizer.ui.auth import DataSession, PageSession, check_csrf, form
from optimizer.ui.offers import offers_page
from optimizer.ui.overview import overview
from optimizer.ui.render import HEADERS, html

router = APIRouter(prefix="/ui", include_in_schema=False)

REFRESH_MS = 3000  # the live parts' polling period: within the issue's 5 s
LOGS_MS = 2000


def _common(state: ApiState, session: sessions.Session, nav: str) -> dict[str, Any]:
    return {
        "csrf": sessions.csrf_token(state.token.get_secret_value(), session),
        "nav": nav,
        "refresh_ms": REFRESH_MS,
        "logs_ms": LOGS_MS,
    }


def _job(state: ApiState, name: str) -> JobRecord:
    job = state.store.jobs.get_job(name)
    if job is None:
        raise HTTPException(404, detail=f"no job named {name!r}")
    return job


# -- overview ------------------------------------------------------------------------------


@router.get("/")
async def overview_page(request: Request, state: StateDep, session: PageSession) -> Response:
    data = await run_in_threadpool(overview, state)
    return html(
        request, "overview.html", o=data, title="Overview", **_common(state, session, "overview")
    )


@router.get("/fragments/overview")
async def overview_fragment(request: Request, state: StateDep, _: DataSession) -> Response:
    data = await run_in_threadpool(overview, state)
    return html(request, "_overview.html", o=data)


# -- jobs ----------------------------------------------------------------------------------


@router.get("/jobs")
async def jobs_page(
    request: Request,
    state: StateDep,
    session: PageSession,
    job_state: Annotated[str | None, Query(alias="state")] = None,
) -> Response:
    wanted = job_state if job_state in {s.value for s in JobState} else None
    rows = await run_in_threadpool(job_views.job_rows, state, wanted)
    return html(
        request,
        "jobs.html",
        rows=rows,
        states=[s.value for s in JobState],
        wanted=wanted,
        title="Jobs",
        **_common(state, session, "jobs"),
    )


@router.get("/jobs/{name}")
async def job_page(
    request: Request, name: str, state: StateDep, session: PageSession, cancelled: int = 0
) -> Response:
    job = await run_in_threadpool(_job, state, name)
    data = await run_in_threadpool(job_views.job_page, state, job)
    # an ended job's output is all there is: in the page, not followed
    logs = await run_in_threadpool(job_views.logs_tail, state, job) if data.ended else None
    return html(
        request,
        "job.html",
        p=data,
        logs=logs,
        cancelled=bool(cancelled),
        title=f"Job {job.given_name}",
        **_common(state, session, "jobs"),
    )


@router.get("/fragments/jobs/{name}")
async def job_fragment(
    request: Request, name: str, state: StateDep, session: DataSession
) -> Response:
    job = await run_in_threadpool(_job, state, name)
    data = await run_in_threadpool(job_views.job_page, state, job)
    return html(request, "_job.html", p=data, **_common(state, session, "jobs"))


@router.get("/data/jobs/{name}/logs")
async def job_logs(name: str, state: StateDep, _: DataSession) -> Response:
    job = await run_in_threadpool(_job, state, name)
    text = await run_in_threadpool(job_views.logs_tail, state, job)
    return PlainTextResponse(text or "(no output yet)", headers=HEADERS)


@router.get("/data/jobs/{name}/utilization")
async def job_utilization(name: str, state: StateDep, _: DataSession) -> Response:
    job = await run_in_threadpool(_job, state, name)
    return JSONResponse(await run_in_threadpool(job_views.utilization, state, job), headers=HEADERS)


@router.post("/jobs/{name}/cancel")
async def cancel_job(
    request: Request, name: str, state: StateDep, session: PageSession
) -> Response:
    """What `POST /jobs/{name}/cancel` does, from the job's page (its form's CSRF token
    checked first): record the request and wake the reconcile loop."""
    check_csrf(state, session, await form(request))
    job, _ = await run_in_threadpool(state.store.jobs.request_cancel, name)
    if job is None:
        raise HTTPException(404, detail=f"no job named {name!r}")
    if job.state in TERMINAL_JOB_STATES:
        raise HTTPException(409, detail=f"job {name!r} already ended ({job.state})")
    state.wakeup.set()
    return RedirectResponse(f"/ui/jobs/{name}?cancelled=1", status_code=303, headers=HEADERS)


# -- offers, prices, policies ----------------------------------------------------------------


@router.get("/offers")
async def offers(
    request: Request,
    state: StateDep,
    session: PageSession,
    policy: str | None = None,
    q: Annotated[str, Query(max_length=200)] = "",
    rule: str | None = None,
) -> Response:
    loaded = state.policies.snapshot()
    name = policy if policy in loaded else (sorted(loaded)[0] if loaded else None)
    page = None
    if name is not None:
        page = await run_in_threadpool(offers_page, state, loaded[name], q.strip(), rule or None)
    return html(
        request,
        "offers.html",
        page=page,
        names=sorted(loaded),
        chosen=name,
        unknown=policy if policy and policy not in loaded else None,
        rule=rule or "",
        title="Offers",
        **_common(state, session, "offers"),
    )


def _pool_choice(state: ApiState, pool: str | None) -> tuple[list[Any], Any, Any]:
    offers = state.store.prices.latest_offers()
    pools = price_views.spot_pools(offers)
    chosen = price_views.PoolKey.parse(pool) if pool else None
    by_key = dict(pools)
    if chosen is None and pools:
        chosen = _default_pool(state, by_key) or pools[0][0]
    return pools, chosen, by_key.get(chosen) if chosen else None


def _default_pool(state: ApiState, by_key: dict[Any, Any]) -> Any:
    """The spot pool of the best offer of the first policy that has one."""
    from optimizer.jobs.ranking import launch_ranking

    for name, loaded in sorted(state.policies.snapshot().items()):
        found = launch_ranking(state.store, name, loaded.policy, state.clock())
        for c in found.ranking.candidates:
            o = c.offer
            key = price_views.PoolKey(o.provider, o.region, o.zone, o.instance_type)
            if key in by_key:
                return key
    return None


@router.get("/prices")
async def prices(
    request: Request,
    state: StateDep,
    session: PageSession,
    pool: str | None = None,
    policy: str | None = None,
    days: Annotated[int, Query(ge=1, le=price_views.MAX_DAYS)] = 2,
) -> Response:
    pools, chosen, offer = await run_in_threadpool(_pool_choice, state, pool)
    loaded = state.policies.snapshot()
    policy_name = policy if policy in loaded else (sorted(loaded)[0] if loaded else None)
    return html(
        request,
        "prices.html",
        pools=pools,
        chosen=chosen,
        offer=offer,
        names=sorted(loaded),
        policy_name=policy_name,
        days=days,
        title="Prices",
        **_common(state, session, "prices"),
    )


@router.get("/data/prices")
async def price_data(
    state: StateDep,
    _: DataSession,
    pool: str,
    policy: str | None = None,
    days: Annotated[int, Query(ge=1, le=price_views.MAX_DAYS)] = 2,
) -> Response:
    key = price_views.PoolKey.parse(pool)
    if key is None:
        raise HTTPException(422, detail="pool: provider|region|zone|instance_type")
    loaded = state.policies.get(policy) if policy else None
    gpus = next(
        (
            o.gpu_count
            for o in state.store.prices.latest_offers(provider=key.provider)
            if o.instance_type == key.instance_type
        ),
        1,
    )
    data = await run_in_threadpool(
        price_views.history, state, key, days, loaded.policy if loaded else None, gpus
    )
    return JSONResponse(data, headers=HEADERS)


def _model_choice(state: ApiState, gpu: str | None) -> tuple[list[Any], str | None]:
    """The GPU models held, and the one to show: `gpu` when held, else the model of the
    best offer of the first policy that has one, else the first."""
    held = gpu_views.models(state.store.prices.latest_offers())
    names = {model for model, _ in held}
    if gpu in names or not held:
        return held, gpu if gpu in names else None
    from optimizer.jobs.ranking import launch_ranking

    for name, loaded in sorted(state.policies.snapshot().items()):
        found = launch_ranking(state.store, name, loaded.policy, state.clock())
        for c in found.ranking.candidates:
            if c.offer.gpu_model in names:
                return held, c.offer.gpu_model
    return held, held[0][0]


# The form sends "" for "any count" and "both markets".
GpusQuery = Annotated[str, Query(max_length=3, pattern=r"^([1-9][0-9]{0,2})?$")]
MarketQuery = Annotated[str, Query(pattern=r"^(spot|on_demand)?$")]
RegionsQuery = Annotated[str, Query(max_length=200)]


@router.get("/prices/gpu")
async def gpu_prices(
    request: Request,
    state: StateDep,
    session: PageSession,
    gpu: str | None = None,
    gpus: GpusQuery = "",
    market: MarketQuery = "",
    regions: RegionsQuery = "",
    policy: str | None = None,
    days: Annotated[int, Query(ge=1, le=price_views.MAX_DAYS)] = 2,
) -> Response:
    held, chosen = await run_in_threadpool(_model_choice, state, gpu)
    loaded = state.policies.snapshot()
    globs = gpu_views.region_globs(regions)
    params: dict[str, Any] = {"gpu": chosen, "days": days}
    if gpus:
        params["gpus"] = gpus
    if market:
        params["market"] = market
    if globs:
        params["regions"] = " ".join(globs)
    if policy in loaded:
        params["policy"] = policy
    return html(
        request,
        "prices_gpu.html",
        models=held,
        chosen=chosen,
        unknown=gpu if gpu and gpu != chosen else None,
        counts=dict(held).get(chosen, []) if chosen else [],
        gpus=int(gpus) if gpus else None,
        market=market,
        regions=" ".join(globs),
        names=sorted(loaded),
        policy_name=policy if policy in loaded else "",
        days=days,
        src="/ui/data/prices/gpu?" + urlencode(params),
        title="Prices by GPU model",
        **_common(state, session, "prices"),
    )


@router.get("/data/prices/gpu")
async def gpu_price_data(
    state: StateDep,
    _: DataSession,
    gpu: Annotated[str, Query(min_length=1, max_length=100)],
    gpus: GpusQuery = "",
    market: MarketQuery = "",
    regions: RegionsQuery = "",
    policy: str | None = None,
    days: Annotated[int, Query(ge=1, le=price_views.MAX_DAYS)] = 2,
) -> Response:
    loaded = state.policies.get(policy) if policy else None
    choice = gpu_views.Choice(
        gpu,
        int(gpus) if gpus else None,
        Market(market) if market else None,
        gpu_views.region_globs(regions),
        days,
    )
    data = await run_in_threadpool(
        gpu_views.history, state, choice, loaded.policy if loaded else None
    )
    return JSONResponse(data, headers=HEADERS)


@router.get("/policies")
async def policies(request: Request, state: StateDep, session: PageSession) -> Response:
    loaded = sorted(state.policies.snapshot().items())
    versions = {
        name: await run_in_threadpool(state.store.policies.policy_versions, name, 5)
        for name, _ in loaded
    }
    return html(
        request,
        "policies.html",
        loaded=[p for _, p in loaded],
        rejected=sorted(state.policies.rejected().values(), key=lambda r: r.path),
        versions=versions,
        title="Policies",
        **_common(state, session, "policies"),
    )


@router.get("/machines")
async def machines(request: Request, state: StateDep, session: PageSession) -> Response:
    """The owned machines (docs/owned.md): state, GPUs in use, measured utilization, TCO rate."""
    get = state.extras.get("machines")
    views: list[dict[str, Any]] = []
    if get is not None:
        provider = await run_in_threadpool(get)
        views = [v.to_dict() for v in await run_in_threadpool(provider.views)]
    return html(
        request,
        "machines.html",
        configured=get is not None,
        machines=views,
        title="Machines",
        **_common(state, session, "machines"),
    )
