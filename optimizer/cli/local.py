"""`gpuopt local ...`: look at and poke the local cloud (instances, interruptions, faults,
simulated GPU telemetry, pinned prices and capacity, spot capacity following a trace).

These commands act on the local cloud's state directory (`<data dir>/local-cloud` unless
`--state-dir` says otherwise), which the daemon's local cloud reads: an interruption written
here shows on the instance's metadata endpoint at once, and the daemon's local cloud powers
the instance off when its grace period ends. `list` and `interrupt` never create that
directory: a missing one is an error naming it; `fail-next`, `price` and `capacity` may
set a drill up before any daemon ran, so they create it and say where they wrote.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from optimizer.cli.common import fail
from optimizer.clock import utc_text
from optimizer.daemon.settings import DATA_DIR_ENV

if TYPE_CHECKING:
    from providers.local.state import InstanceRecord

app = typer.Typer(
    help="The local cloud: list instances, inject interruptions, launch failures and GPU "
    "readings, pin prices and take capacity away.",
    no_args_is_help=True,
    add_completion=False,
)

StateDirOption = Annotated[
    Path | None,
    typer.Option(
        "--state-dir",
        help="The local cloud's state directory (default: <GPUOPT_DATA_DIR>/local-cloud).",
        file_okay=False,
    ),
]


def default_state_dir() -> Path:
    from optimizer.daemon.settings import data_dir

    return data_dir() / "local-cloud"


def _existing(state_dir: Path | None) -> Path:
    """The state directory, which must exist: a command that only reads or changes instances
    never creates one (a mistyped GPUOPT_DATA_DIR would otherwise look like an empty cloud)."""
    root = state_dir or default_state_dir()
    if not root.is_dir():
        named = os.environ.get(DATA_DIR_ENV, "").strip()
        if state_dir is not None:
            where = "--state-dir"
        elif named:
            where = f"from {DATA_DIR_ENV}={named}"
        else:
            where = f"the default data directory; {DATA_DIR_ENV} is not set"
        fail(
            f"no local cloud at {root} ({where}); a daemon creates it when it first launches "
            "an instance there"
        )
    return root


def _cloud(state_dir: Path):  # -> LocalCloud, imported lazily
    from optimizer.clock import machine_now
    from providers.local import LocalCloud

    # this machine's time: a test's cloud on a clock of its own passes its offset (clock_env)
    return LocalCloud(state_dir, clock=lambda: machine_now().timestamp())


def _when(t: float | None) -> str:
    if t is None:
        return "-"
    return utc_text(datetime.fromtimestamp(t, UTC), timespec="seconds", sep=" ")


@app.command("list")
def list_instances(
    state_dir: StateDirOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON list.")] = False,
    all_: Annotated[bool, typer.Option("--all", help="Include ended instances.")] = False,
) -> None:
    """List the local cloud's instances (running ones unless --all)."""
    from optimizer.cli.render import columns

    root = _existing(state_dir)
    records = [r for r in _cloud(root).instances() if all_ or not r.ended]
    if as_json:
        json.dump([r.to_json() for r in records], sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    if not records:
        print(
            f"no instances in {root}"
            if all_
            else f"no running instances in {root} (--all shows ended ones)"
        )
        return
    rows = []
    labels = job_labels(records)
    for r in records:
        detail = r.detail
        if r.interruption is not None and not r.ended:
            detail = f"interrupted: power-off at {_when(r.interruption.kill_at)}"
        price = f"{r.usd_per_hour:.4f}" + (" sim" if r.market == "spot" else "")
        job = labels[r.id]
        rows.append([r.id, _state(r), r.instance_type, r.zone, r.market, price, job, detail or "-"])
    headers = ["INSTANCE", "STATE", "TYPE", "ZONE", "MARKET", "$/h", "JOB", "DETAIL"]
    columns(headers, rows, right=["$/h"])


def _job_id(key: str) -> int | None:
    """The daemon's job id in an instance's launch key (`<job id>-<attempt>[-n<rank>]`)."""
    head = key.split("-", 1)[0]
    return int(head) if head.isdigit() else None


def job_labels(records: list[InstanceRecord]) -> dict[str, str]:
    """Each instance's JOB cell: `name #attempt`. Job names are unique among the daemon's
    jobs until one is removed, so where instances of two jobs share a name, every job but the
    newest (the highest id in the launch keys) was removed: its instances say so, with its id,
    and are never taken for the new job's."""
    newest: dict[str, int] = {}
    for r in records:
        jid = _job_id(r.key)
        if r.job and jid is not None:
            newest[r.job] = max(newest.get(r.job, jid), jid)
    labels = {}
    for r in records:
        if not r.job:
            labels[r.id] = r.key
            continue
        jid = _job_id(r.key)
        removed = jid is not None and jid < newest.get(r.job, jid)
        labels[r.id] = f"{r.job} #{r.attempt}" + (f" (removed job {jid})" if removed else "")
    return labels


def _state(record: InstanceRecord) -> str:
    """`running`, `terminated (preempted)`, `terminated (by gpuopt)`…"""
    if not record.ended or not record.end_reason:
        return record.state
    # Only gpuopt (the daemon) calls terminate(), which sets stop_at; other ends that count
    # as the user's are the instance shutting itself down.
    who = "by gpuopt" if record.end_reason == "user" and record.stop_at is not None else None
    return f"{record.state} ({who or record.end_reason})"


@app.command("history")
def history(
    days: Annotated[
        int, typer.Option("--days", min=1, max=90, help="Days of history before the store's first.")
    ] = 7,
    config: Annotated[
        Path | None,
        typer.Option("--config", help="The daemon config whose store to write.", dir_okay=False),
    ] = None,
    until: Annotated[
        str | None,
        typer.Option("--until", help="ISO 8601 time the days end at (default: now)."),
    ] = None,
) -> None:
    """Write the local cloud's simulated prices of the last --days into the daemon's store,
    one point per pool and hour before its first local price (a function of the seed, the
    pool and the time, labelled simulated), for backtests and charts from the first minute."""
    from datetime import UTC, datetime

    from optimizer.cli.db import configured_database_url, sqlite_file_missing
    from optimizer.store import Store
    from providers.local.history import backfill

    end = datetime.now(UTC)
    if until is not None:
        from optimizer.cli.ranked import parse_at

        end = parse_at(until, option="--until")
    url = configured_database_url(config)
    if sqlite_file_missing(url):
        fail("no store yet: start the daemon once (it creates it, and writes this history)")
    cloud = _cloud(default_state_dir())
    with Store(url) as store:
        done = backfill(
            cloud,
            store.prices.record_history,
            store.prices.earliest_observation("local"),
            now=end,
            days=days,
        )
    print(done.summary())


@app.command("interrupt")
def interrupt(
    instance: Annotated[str, typer.Argument(help="Instance id, e.g. i-local-0001.")],
    state_dir: StateDirOption = None,
    grace: Annotated[
        float | None,
        typer.Option(
            "--grace",
            min=0,
            help="Seconds from the notice to power-off (default: the running cloud's, 30).",
        ),
    ] = None,
    action: Annotated[
        str, typer.Option("--action", help="The notice's action: terminate, stop, hibernate.")
    ] = "terminate",
) -> None:
    """Interrupt a spot instance: post the notice now, power it off after the grace period."""
    if action not in ("terminate", "stop", "hibernate"):
        fail(f"--action must be terminate, stop or hibernate, not {action!r}")
    cloud = _cloud(_existing(state_dir))
    try:
        record = cloud.interrupt(instance, grace_s=grace, action=action)
    except (KeyError, ValueError) as exc:
        fail(exc.args[0] if exc.args else exc)
    assert record.interruption is not None
    print(
        f"{instance}: interruption notice posted ({record.interruption.action}); "
        f"power-off at {_when(record.interruption.kill_at)}"
    )


@app.command("telemetry")
def telemetry(
    instance: Annotated[str, typer.Argument(help="Instance id, e.g. i-local-0001.")],
    state_dir: StateDirOption = None,
    util: Annotated[
        float | None,
        typer.Option("--util", help="GPU utilization to report, a fraction 0..1 (e.g. 0.03)."),
    ] = None,
    memory: Annotated[
        float, typer.Option("--memory", help="GPU memory used, a fraction 0..1 of the total.")
    ] = 0.0,
    gpus: Annotated[
        int | None,
        typer.Option("--gpus", min=1, help="How many GPUs to report (default: the type's)."),
    ] = None,
    memory_gib: Annotated[
        float | None,
        typer.Option("--memory-gib", help="Memory of each GPU, GiB (default: the type's)."),
    ] = None,
    every: Annotated[
        float, typer.Option("--every", help="Seconds between the agent's readings.")
    ] = 10.0,
    clear: Annotated[bool, typer.Option("--clear", help="End the injection.")] = False,
) -> None:
    """Inject simulated GPU readings for one instance: its agent reports them (labelled
    simulated) instead of reading NVML, until --clear."""
    if util is None and not clear:
        fail("give --util (and --memory), or --clear")
    cloud = _cloud(_existing(state_dir))
    try:
        record = cloud.inject_telemetry(
            instance,
            util=None if clear else util,
            memory=memory,
            gpus=gpus,
            memory_gib=memory_gib,
            interval_s=every,
        )
    except (KeyError, ValueError) as exc:
        fail(exc.args[0] if exc.args else exc)
    if clear:
        print(f"{instance}: simulated GPU telemetry cleared")
    else:
        from providers.local.cloud import TELEMETRY

        shown = record.extra[TELEMETRY]
        print(
            f"{instance}: simulated GPU telemetry: utilization {util:.0%}, memory {memory:.0%} "
            f"of {shown['gpus']} x {shown['memory_gib']:g} GiB, every {every:g} s"
        )


@app.command("fail-next")
def fail_next(
    match: Annotated[
        str, typer.Argument(help="Instance type, region or zone the fault applies to; * = any.")
    ],
    state_dir: StateDirOption = None,
    error: Annotated[
        str,
        typer.Option(
            "--error", help="capacity, quota, price, throttled, auth or provider (the type)."
        ),
    ] = "capacity",
    times: Annotated[int, typer.Option("--times", min=1, help="How many launches fail.")] = 1,
) -> None:
    """Make the next launches on matching offers fail with a typed cloud error."""
    from providers.local import FAULTS

    if error not in FAULTS:
        fail(f"--error must be one of {', '.join(FAULTS)}, not {error!r}")
    # Allowed before any daemon ran (it creates the folder), so it says where it wrote.
    root = state_dir or default_state_dir()
    _cloud(root).fail_next(match, error, times=times)
    print(
        f"the next {times} launch(es) matching {match!r} will fail with a {error} error "
        f"(recorded in {root})"
    )


POOL_HELP = "TYPE@ZONE for a spot pool (g4dn.xlarge@eu-central-1-a), TYPE@REGION for on-demand."


def _written(state_dir: Path | None) -> Path:
    """The state directory for a command that may set the market up before any daemon ran
    (it creates the folder, and says where it wrote)."""
    return state_dir or default_state_dir()


@app.command("price")
def price(
    pool: Annotated[
        str,
        typer.Argument(help=POOL_HELP),
    ],
    state_dir: StateDirOption = None,
    usd: Annotated[
        float | None, typer.Option("--usd", help="The price to hold, USD per instance-hour.")
    ] = None,
    for_: Annotated[
        str | None,
        typer.Option(
            "--for",
            help="How long to hold it (90s, 30m, 2h), from when the running cloud sees it; "
            "default: until --clear.",
        ),
    ] = None,
    clear: Annotated[bool, typer.Option("--clear", help="Let the price move again.")] = False,
) -> None:
    """Pin a pool's simulated price (the daemon sees it at its next poll)."""
    from policies.schema import parse_duration
    from providers.local import market

    if clear == (usd is not None):
        fail("give --usd PRICE (and --for DURATION), or --clear")
    if clear and for_ is not None:
        fail("--for goes with --usd, not with --clear")
    seconds: float | None = None
    if for_ is not None:
        try:
            seconds = float(parse_duration(for_))
        except (TypeError, ValueError) as exc:
            fail(f"--for: {exc}")
    root = _written(state_dir)
    cloud = _cloud(root)
    try:
        name = market.check_pool(pool, cloud.fetch_offers())
        market.pin(cloud.state, name, usd, for_s=seconds, now=None)
    except ValueError as exc:
        fail(exc.args[0] if exc.args else exc)
    if usd is None:
        print(f"{name}: price unpinned; it follows the simulation again (recorded in {root})")
        return
    span = f" for {for_} from when the running cloud sees it" if for_ else " until --clear"
    print(f"{name}: price pinned at ${usd:.4f}/h{span} (recorded in {root})")


@app.command("capacity")
def capacity(
    pool_arg: Annotated[
        str | None,
        typer.Argument(metavar="[POOL]", help=POOL_HELP),
    ] = None,
    available: Annotated[
        bool | None,
        typer.Option(
            "--available/--unavailable",
            help="Give the pool capacity back (and stop its trace), or take it away (launches "
            "in it fail).",
        ),
    ] = None,
    trace: Annotated[
        Path | None,
        typer.Option(
            "--trace",
            help="A spot availability trace (the public spot-traces JSON: metadata.gap_seconds "
            "and data, the instances obtainable at each tick) the pool's spot capacity follows "
            "from when the running cloud sees it.",
            dir_okay=False,
        ),
    ] = None,
    pool_opt: Annotated[
        str | None,
        typer.Option(
            "--pool", help="The spot pool that follows --trace (default: every spot pool)."
        ),
    ] = None,
    tick: Annotated[
        float | None,
        typer.Option(
            "--tick",
            help="Real seconds one trace tick lasts (default: the trace's gap_seconds); "
            "fewer make a drill over days of trace take minutes.",
        ),
    ] = None,
    no_trace: Annotated[
        bool,
        typer.Option("--no-trace", help="Stop following a trace (the pool's, else every one)."),
    ] = False,
    state_dir: StateDirOption = None,
) -> None:
    """Take a pool's capacity away (its launches fail, its price stays listed) or give it
    back; or make spot capacity follow an availability trace (--trace FILE)."""
    from providers.local import market
    from providers.local.trace import TraceError, read_trace

    if pool_arg is not None and pool_opt is not None and pool_arg != pool_opt:
        fail(f"give the pool once: {pool_arg!r} and --pool {pool_opt!r} differ")
    pool = pool_opt or pool_arg
    if sum((available is not None, trace is not None, no_trace)) != 1:
        fail("give --available or --unavailable, or --trace FILE (or --no-trace)")
    if tick is not None and trace is None:
        fail("--tick goes with --trace")
    root = _written(state_dir)
    cloud = _cloud(root)
    if available is not None:
        if pool is None:
            fail("--available and --unavailable name a POOL")
        try:
            name = market.check_pool(pool, cloud.fetch_offers())
            market.set_capacity(cloud.state, name, available=available)
        except ValueError as exc:
            fail(exc.args[0] if exc.args else exc)
        if available:
            print(f"{name}: capacity available again (recorded in {root})")
        else:
            print(
                f"{name}: no capacity; launches there fail with InsufficientInstanceCapacity "
                f"(recorded in {root})"
            )
        return
    name = market.EVERY_SPOT_POOL
    if pool is not None:
        try:
            name = market.check_pool(pool, cloud.fetch_offers())
        except ValueError as exc:
            fail(exc.args[0] if exc.args else exc)
        if not any(market.pool_name(o) == name and o.zone for o in cloud.fetch_offers()):
            fail(f"{name} is an on-demand pool; a trace sets spot capacity (TYPE@ZONE)")
    which = "every spot pool" if name == market.EVERY_SPOT_POOL else name
    if no_trace:
        market.follow_trace(cloud.state, name, None, now=None)
        print(f"{which}: no longer follows a capacity trace (recorded in {root})")
        return
    assert trace is not None
    try:
        followed = read_trace(trace, tick_s=tick)
    except TraceError as exc:
        fail(str(exc))
    market.follow_trace(cloud.state, name, followed, now=None)
    ticks = len(followed.counts)
    print(
        f"{which}: spot capacity follows {trace.name} ({ticks} ticks of {followed.tick_s:g} s, "
        f"{followed.span_s:g} s in all; counts {min(followed.counts)}..{max(followed.counts)}) "
        f"from when the running cloud sees it; the last count holds after (recorded in {root})"
    )
