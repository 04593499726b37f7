"""`gpuopt jobs …`: submit, list, show, cancel, remove and follow managed jobs, and read their
output, through the daemon's API.

The API address is `--api` or `GPUOPT_API_URL` (default http://127.0.0.1:8470); the token is
`GPUOPT_API_TOKEN` or the file the daemon writes, `<data dir>/api-token`.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from optimizer.cli import client
from optimizer.cli.client import ApiOption
from optimizer.cli.client import call as _call
from optimizer.cli.common import error, fail
from optimizer.cli.plan import effective_policy_header, effective_policy_lines
from optimizer.cli.render import OutputOption, WideOption, wants_wide

if TYPE_CHECKING:
    from optimizer.answers import AttemptView, DeadlineView, GpuView, JobView, ProgressView

app = typer.Typer(
    help="Submit and follow managed jobs (through the daemon's API).", no_args_is_help=True
)

JsonOption = Annotated[bool, typer.Option("--json", help="Print the API's JSON.")]
YesOption = Annotated[
    bool, typer.Option("--yes", "-y", help="Submit without asking (after printing the plan).")
]
DryRunOption = Annotated[
    bool, typer.Option("--dry-run", help="Print the plan and stop: nothing is submitted.")
]


def _job(answer: Any) -> JobView:
    from optimizer.answers import JobView

    return client.read(JobView, answer)


def check_name(name: str) -> None:
    """End the command (exit 2) when `--name` is no job name."""
    import re

    from policies.schema import NAME_PATTERN

    if not re.fullmatch(NAME_PATTERN, name):
        fail(
            f"--name {name!r}: a job name is 1-63 lowercase letters, digits and dashes, "
            "starting and ending with a letter or digit"
        )


def print_job_answer(answer: Any) -> None:
    """The API's job answer, read and printed as `_print_job` does."""
    _print_job(_job(answer))


def _print_job(job: JobView, *, with_policy: bool = True) -> None:
    """The job's summary lines; `with_policy`: its effective policy too (`jobs show` prints
    it in its own section)."""
    from optimizer.answers import JobDetail

    print(f"{job.name}: {job.state} (policy {job.policy}, restarts {job.restarts})")
    if job.reason:
        print(f"  {job.reason}")
    if job.cancel_requested_at and job.state != "cancelled":
        print(f"  cancel requested at {job.cancel_requested_at}; the daemon is stopping it")
    bucket = job.spec.get("checkpoint")
    if isinstance(bucket, dict) and bucket.get("uri"):
        region = bucket.get("region") or "region unknown"
        print(f"  checkpoints: {bucket['uri']} ({region}, keeps {bucket.get('keep', 3)})")
    _print_code(job.spec)
    if job.progress is not None:
        print("  " + progress_line(job.progress))
        if job.progress.by_type:
            print("  " + speeds_line(job.progress))
    if isinstance(job, JobDetail) and job.gpu:
        print("  " + gpu_line(job.gpu))
    if isinstance(job, JobDetail) and job.deadline:
        print("  " + deadline_line(job.deadline))
    if isinstance(job, JobDetail):
        for a in job.attempts:
            if a.role == "warm_spare" and a.state != "ended":
                print("  " + spare_line(a))
    if with_policy and isinstance(job, JobDetail) and job.effective_policy:
        print("  " + effective_policy_header(job))
        for line in effective_policy_lines(job.effective_policy):
            print("    " + line)


def spare_line(a: AttemptView) -> str:
    """`warm spare: attempt 3 on local eu-west/b gpu.a10 spot at $0.4100/h, probed (pass)`."""
    zone = f"/{a.zone}" if a.zone else ""
    where = f"{a.provider} {a.region}{zone} {a.instance_type} {a.market}"
    price = "" if a.usd_per_hour is None else f" at ${a.usd_per_hour:.4f}/h"
    if a.probe_status is not None:
        status = f"probed ({a.probe_status})"
    elif a.registered_at is not None:
        status = "registered, probing"
    else:
        status = "booting"
    return f"warm spare: attempt {a.number} on {where}{price}, {status}"


def deadline_line(d: DeadlineView) -> str:
    """`deadline: 2026-12-04 18:00 UTC; work left 3.1 h, slack 5.2 h (at risk)`."""
    return f"deadline: {d.summary()}"


def _when(text: str | None) -> str:
    """`2026-12-02 01:10 UTC` for the API's `2026-12-02T01:10:27Z`."""
    return f"{text[:10]} {text[11:16]} UTC" if text else "-"


def progress_line(p: ProgressView) -> str:
    """`progress: step 1,200 of 10,000 (12%), 3,400 steps/h on g5.xlarge; ETA 2026-12-02
    01:10 UTC` (docs/progress.md)."""
    text = f"progress: step {p.step:,}"
    if p.total is not None:
        text += f" of {p.total:,} ({p.step / p.total:.0%})"
    text += f" at {_when(p.at)}"
    if p.steps_per_hour is not None:
        text += f", {p.steps_per_hour:,.0f} steps/h on {p.instance_type or 'unknown type'}"
    if p.eta is not None:
        text += f"; ETA {_when(p.eta)}"
    elif p.total is not None and p.step < p.total and p.steps_per_hour is None:
        text += "; ETA once a speed is measured"
    return text


def speeds_line(p: ProgressView) -> str:
    """`steps/h by instance type: g5.xlarge 3,400, p3.2xlarge 5,100`."""
    return "steps/h by instance type: " + ", ".join(
        f"{kind} {speed:,.0f}" for kind, speed in p.by_type.items()
    )


def progress_cell(p: ProgressView | None) -> str:
    """The list's progress column: `12% ETA 12-02 01:10`, `step 1,200`, or `-`."""
    if p is None:
        return "-"
    done = f"{p.step / p.total:.0%}" if p.total else f"step {p.step:,}"
    if not p.eta or (p.total is not None and p.step >= p.total):  # no ETA once it is done
        return done
    return f"{done} ETA {p.eta[5:10]} {p.eta[11:16]}"


def _print_code(spec: Any) -> None:
    """`  code: sha256:3f2a9c01b7de (0.05 MiB)` for a job that runs an uploaded archive."""
    code = spec.get("code") if isinstance(spec, dict) else None
    if not isinstance(code, dict) or not isinstance(code.get("sha256"), str):
        return
    size = code.get("size")
    mib = f"{size / (1 << 20):.2f} MiB" if isinstance(size, int) else "size unknown"
    print(f"  code: sha256:{code['sha256'][:12]} ({mib})")


def gpu_line(gpu: GpuView) -> str:
    """`GPU: utilization 3% now (12:04 UTC), 5% average since 11:58 UTC; peak memory 16.0 of
    80.0 GiB (20%) [simulated]`."""

    def pct(value: Any) -> str:
        return "-" if value is None else f"{value:.0%}"

    def hhmm(text: Any) -> str:
        return str(text)[11:16] + " UTC" if text else "-"

    peak, total = gpu.peak_memory_used_gib, gpu.memory_total_gib
    memory = "-" if peak is None else f"{peak:.1f}"
    if peak is not None and total:
        memory += f" of {total:.1f} GiB ({peak / total:.0%})"
    elif peak is not None:
        memory += " GiB"
    line = (
        f"GPU: utilization {pct(gpu.current_utilization)} now "
        f"({hhmm(gpu.current_at)}), {pct(gpu.average_utilization)} average "
        f"since {hhmm(gpu.since)}; peak memory {memory}"
    )
    return line + (" [simulated]" if gpu.simulated else "")


@app.command("submit")
def submit(
    file: Annotated[Path, typer.Argument(help="Job spec YAML.", show_default=False)],
    name: Annotated[
        str | None,
        typer.Option("--name", help="Submit under this name instead of the spec's (a re-run)."),
    ] = None,
    code: Annotated[
        Path | None,
        typer.Option(
            "--code",
            help="Pack this folder and run the job in it (default: the spec's workdir, when "
            "it is a folder here).",
            show_default=False,
        ),
    ] = None,
    yes: YesOption = False,
    dry_run: DryRunOption = False,
    api: ApiOption = None,
    as_json: JsonOption = False,
) -> None:
    """Check a job spec, print the plan (the offers its launch would walk, the rejections
    by rule), ask "Launch?" on a terminal, and hand it to the daemon with its code
    (docs/cli.md, "The plan"; docs/code.md)."""
    from optimizer.cli.plan import submit_planned
    from optimizer.jobs.spec import JobSpecError, load_job_spec

    if name is not None:
        check_name(name)
    try:
        spec = load_job_spec(file)
    except JobSpecError as exc:
        fail(*exc.problems, prefixed=False)
    if name is not None:
        spec = spec.model_copy(update={"name": name})
    submit_planned(
        spec,
        file,
        code,
        api,
        yes=yes,
        dry_run=dry_run,
        as_json=as_json,
        show_job=print_job_answer,
    )


@app.command("list")
def list_jobs(
    all_: Annotated[bool, typer.Option("--all", help="Include ended jobs.")] = False,
    api: ApiOption = None,
    as_json: JsonOption = False,
    output: OutputOption = None,
    wide: WideOption = False,
) -> None:
    """The queue, newest first: each job's state, where it runs now, its price, age, running
    time, restarts, spend so far and progress (live jobs unless --all)."""
    from optimizer.answers import JobList
    from optimizer.cli.queue import print_list

    params = {} if all_ else {"live": "true"}
    answer = _call("GET", "/jobs", api, params=params)
    jobs = client.read(JobList, answer).jobs
    if as_json or output == "json":
        print(json.dumps(answer["jobs"], indent=2))
        return
    print_list(jobs, progress_cell, everything=all_, wide=wants_wide(output, wide))


EVENTS_SHOWN = 10


@app.command("show")
def show(
    name: str,
    api: ApiOption = None,
    as_json: JsonOption = False,
    output: OutputOption = None,
    wide: WideOption = False,
) -> None:
    """One job: its state and why, where it runs, its policy, its attempts (placement, times,
    end reason, cost) and its latest events."""
    from optimizer.answers import EventList, JobDetail
    from optimizer.cli.queue import print_show

    answer = _call("GET", f"/jobs/{name}", api)
    job = client.read(JobDetail, answer)
    if as_json or output == "json":
        print(json.dumps(answer, indent=2))
        return
    found = _call("GET", "/events", api, params={"job": name, "limit": EVENTS_SHOWN})
    latest = sorted(client.read(EventList, found).events, key=lambda e: e.id)
    print_show(
        job, latest, head=lambda j: _print_job(j, with_policy=False), wide=wants_wide(output, wide)
    )


@app.command("checkpoints")
def checkpoints(name: str, api: ApiOption = None, as_json: JsonOption = False) -> None:
    """A job's checkpoints in its bucket, newest first: where, when, and which attempts
    restored each."""
    from optimizer.answers import CheckpointList
    from optimizer.common.units import size_text

    answer = _call("GET", f"/jobs/{name}/checkpoints", api)
    found = client.read(CheckpointList, answer).checkpoints
    if as_json:
        print(json.dumps(answer, indent=2))
        return
    if not found:
        print(f"{name}: no checkpoints uploaded yet")
        return
    rows = [("NAME", "STEP", "SIZE", "WHERE", "WHEN", "RESTORED BY")]
    for c in found:
        where = c.uri + (f" ({c.region})" if c.region else "")
        if c.deleted:
            where += " [pruned]"
        rows.append(
            (
                c.name + (" (final)" if c.final else ""),
                "-" if c.step is None else str(c.step),
                size_text(c.size_bytes),
                where,
                (c.committed_at or "-").replace("T", " ").removesuffix("Z") + " UTC",
                ", ".join(f"attempt {n}" for n in c.restored_by) or "-",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        print("  ".join([*cells, row[-1]]).rstrip())


@app.command("cancel")
def cancel(name: str, api: ApiOption = None) -> None:
    """Cancel a job: the daemon terminates its instance and moves it to `cancelled`."""
    _print_job(_job(_call("POST", f"/jobs/{name}/cancel", api)))


@app.command("rm")
def remove(name: str, api: ApiOption = None) -> None:
    """Remove an ended job: it leaves the lists and its name is free for a new submit; its
    events and costs stay under its id."""
    job = _job(_call("DELETE", f"/jobs/{name}", api))
    print(f"removed {job.name} ({job.state}; its events stay under job id {job.id})")


@app.command("events")
def events(
    name: str,
    api: ApiOption = None,
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 100,
    as_json: JsonOption = False,
) -> None:
    """A job's events, oldest first."""
    from optimizer.answers import EventList

    answer = _call("GET", "/events", api, params={"job": name, "limit": limit})
    found = client.read(EventList, answer).events
    # oldest first; --json prints the daemon's own rows in that order
    order = sorted(range(len(found)), key=lambda i: found[i].id)
    if as_json:
        print(json.dumps([answer["events"][i] for i in order], indent=2))
        return
    for event in (found[i] for i in order):
        print(f"{event.at}  {event.severity:<8} {event.kind:<18} {event.message}")


@app.command("logs")
def logs(
    name: str,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new output until the job ends.")
    ] = False,
    attempt: Annotated[
        int | None, typer.Option("--attempt", min=1, help="Only this attempt's output.")
    ] = None,
    tail: Annotated[
        int | None, typer.Option("--tail", min=0, help="Only the last N lines (then follow).")
    ] = None,
    api: ApiOption = None,
) -> None:
    """A job's output (stdout and stderr), each attempt under a header line."""
    params: dict[str, Any] = {"follow": "true"} if follow else {}
    if attempt is not None:
        params["attempt"] = attempt
    if tail is not None:
        params["tail"] = tail
    base = client.base_url(api)
    headers = {"Authorization": f"Bearer {client.token()}"}
    out = sys.stdout
    started = False
    try:
        # Following waits as long as the job runs: no read timeout then.
        with client.stream(
            "GET",
            f"{base}/jobs/{name}/logs",
            headers,
            params=params,
            read_timeout=None if follow else 60,
        ) as answer:
            if answer.status >= 400:
                client.check(client.Response(answer.status, answer.text()))
            for piece in answer.pieces():
                started = True
                out.write(piece)
                out.flush()
    except KeyboardInterrupt:  # Ctrl-C ends a follow: not an error
        raise typer.Exit(130) from None
    except BrokenPipeError:  # `| head` closed the pipe: nothing more to say
        _quiet_stdout()
    except OSError as exc:
        if started:  # cut off mid-answer: the daemon went away
            error(f"lost the daemon at {base}: {client.why(exc)}")
            raise typer.Exit(1) from None
        fail(f"cannot reach the daemon at {base}: {client.why(exc)} (is it running?)")


def _quiet_stdout() -> None:
    """After a broken pipe: point stdout at /dev/null so the exit's flush raises nothing."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
