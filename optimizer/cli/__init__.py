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
    offers,
    policy,
    prices,
    probe,
    probes,
    progress,
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
)

app.add_typer(policy.app, name="policy")
app.command("backtest")(backtest.backtest)
app.command("advise-bid")(backtest.advise_bid)
app.command("probe")(probe.probe)
app.add_typer(probes.app, name="probes")
app.command("daemon")(daemon.daemon)
app.add_typer(db.app, name="db")
app.add_typer(jobs.app, name="jobs")
app.add_typer(config.app, name="config")
app.add_typer(agent.app, name="agent")
app.add_typer(checkpoint.app, name="checkpoint")
app.command("progress")(progress.progress)
app.add_typer(standby.app, name="standby")
app.add_typer(local.app, name="local")
app.command("version")(version.version)
app.command("offers")(offers.offers)
app.add_typer(prices.app, name="prices")
app.command("costs")(costs.costs)
app.command("advise")(advise.advise)
app.command("tco")(tco.tco)

__all__ = ["app", "main"]


def main() -> None:
    app()
