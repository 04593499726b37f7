"""The `gpuopt` command line: one module per command group, wired together here.

Heavy modules (SQLAlchemy, the cloud SDKs, torch) are imported inside the commands that use
them, so `gpuopt --help` stays fast. Bad input exits 2 through `optimizer.cli.common.fail`.
"""

from __future__ import annotations

import typer

from optimizer.cli import (
    advise,
    agent,
    backtest,
    checkpoint,
    config,
    costs,
    daemon,
    db,
    jobs,
    local,
    machines,
    offers,
    policy,
    prices,
    probe,
    probes,
    progress,
    run,
    standby,
    tco,
    version,
)

app = typer.Typer(
    name="gpuopt",
    help="Keep GPU work on the cheapest AWS/GCP capacity that your policy allows.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Plain help text: a docstring's lines are joined into sentences that wrap to the
    # terminal (rich markup would keep the source's line breaks in the middle of them).
    rich_markup_mode=None,
    context_settings={"max_content_width": 100},  # wrap to the terminal, up to 100 columns
)

app.add_typer(policy.app, name="policy")
app.command("backtest")(backtest.backtest)
app.command("advise-bid")(backtest.advise_bid)
app.command("probe")(probe.probe)
app.add_typer(probes.app, name="probes")
app.command("daemon")(daemon.daemon)
app.add_typer(db.app, name="db")
app.command("run", context_settings={"allow_interspersed_args": False})(run.run)
app.add_typer(jobs.app, name="jobs")
app.add_typer(config.app, name="config")
app.add_typer(agent.app, name="agent")
app.add_typer(checkpoint.app, name="checkpoint")
app.command("progress")(progress.progress)
app.add_typer(standby.app, name="standby")
app.add_typer(local.app, name="local")
app.add_typer(machines.app, name="machines")
app.command("version")(version.version)
app.command("offers")(offers.offers)
app.add_typer(prices.app, name="prices")
app.command("costs")(costs.costs)
app.command("advise")(advise.advise)
app.command("tco")(tco.tco)

__all__ = ["app", "main"]


def main() -> None:
    """`gpuopt`: the app, with the command line's own complaints (a missing argument, an
    unknown option) said in gpuopt's one error style, `gpuopt: error: …` and the help to see;
    exit 2 as before."""
    import sys

    from optimizer.cli.common import error

    try:
        code = app(standalone_mode=False, prog_name="gpuopt")
    except Exception as exc:
        # Typer's click (vendored or not) raises these: known by their class names, so no
        # private module is imported.
        names = {c.__name__ for c in type(exc).__mro__}
        if "NoArgsIsHelpError" in names:  # a group alone: its help, as before
            exc.show()  # type: ignore[attr-defined]
            code = exc.exit_code  # type: ignore[attr-defined]
        elif "UsageError" in names:
            words = exc.format_message()  # type: ignore[attr-defined]
            ctx = getattr(exc, "ctx", None)
            command = ctx.command_path if ctx is not None else "gpuopt"
            words = words.rstrip(".")
            error(f"{words[:1].lower()}{words[1:]} (see '{command} --help')")
            code = exc.exit_code  # type: ignore[attr-defined]
        elif "Abort" in names:  # Ctrl-C at a prompt
            print(file=sys.stderr)
            code = 130
        else:
            raise
    sys.exit(code if isinstance(code, int) else 0)
