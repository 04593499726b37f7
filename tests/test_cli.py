"""`gpuopt` as users run it: a real process, its exit code, stdout and stderr."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from optimizer import __version__
from optimizer.catalog import read_catalog
from optimizer.cli.ranked import render
from optimizer.cli.ranking_view import RankingView
from optimizer.model import Market
from optimizer.offers import OfferQuery
from policies import rulebook
from tests.helpers.engine import offer

GOOD_CATALOG = """\
# a small catalog
provider,region,zone,instance_type,gpu_model,gpu_count,gpu_memory_gib,vcpus,ram_gib,interconnect,market,usd_per_hour,observed_at
aws,eu-west-1,euw1-az1,p4d.24xlarge,A100-40GB,8,40.0,96,1152,nvlink,spot,9.5,2026-11-01T00:00:00Z
aws,us-east-1,use1-az2,p4de.24xlarge,A100-80GB,8,80.0,96,1152,nvlink,on_demand,40.96,2026-11-01T00:00:00Z
gcp,europe-west4,europe-west4-a,a2-ultragpu-1g,A100-80GB,1,80.0,12,170,none,spot,2.1,2026-11-01T00:00:00Z
gcp,europe-west2,,g2-standard-8,L4,1,24.0,8,32,none,on_demand,0.85,2026-11-01T00:00:00Z
"""


def gpuopt(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    return subprocess.run(
        [sys.executable, "-m", "optimizer.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=60,
        check=False,
    )


@pytest.fixture
def catalog(tmp_path: Path) -> Path:
    path = tmp_path / "prices.csv"
    path.write_text(GOOD_CATALOG)
    return path


def test_version() -> None:
    done = gpuopt("version")
    assert done.returncode == 0
    assert done.stdout.strip() == __version__


def test_json_rows_are_offer_objects_cheapest_first(catalog: Path) -> None:
    done = gpuopt("offers", "--catalog", str(catalog), "--json")
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert [r["usd_per_hour"] for r in rows] == [0.85, 2.1, 9.5, 40.96]
    assert rows[0]["zone"] is None and rows[0]["market"] == "on_demand"
    assert [r.to_dict() for r in read_catalog(catalog)][3] == rows[0]


def test_filters_reach_the_query(catalog: Path) -> None:
    done = gpuopt(
        "offers",
        "--catalog",
        str(catalog),
        "--json",
        "--gpu",
        "a100-80gb",
        "--region",
        "europe-*",
        "--market",
        "spot",
    )
    assert done.returncode == 0, done.stderr
    assert [(r["region"], r["instance_type"]) for r in json.loads(done.stdout)] == [
        ("europe-west4", "a2-ultragpu-1g")
    ]
    done = gpuopt(
        "offers",
        "--catalog",
        str(catalog),
        "--json",
        "--min-gpu-memory",
        "40",
        "--gpus",
        "8",
        "--limit",
        "1",
    )
    assert [r["instance_type"] for r in json.loads(done.stdout)] == ["p4d.24xlarge"]


def test_table_output_lists_the_offers(catalog: Path) -> None:
    done = gpuopt("offers", "--catalog", str(catalog), "--market", "on-demand")
    assert done.returncode == 0, done.stderr
    assert "g2-standard-8" in done.stdout and "p4de.24xlarge" in done.stdout
    assert "p4d.24xlarge" not in done.stdout  # the spot row
    assert done.stdout.index("g2-standard-8") < done.stdout.index("p4de.24xlarge")


def test_missing_catalog_is_one_line_and_exit_2(tmp_path: Path) -> None:
    done = gpuopt("offers", "--catalog", "does-not-exist.csv", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr == "gpuopt: error: does-not-exist.csv: no such file\n"


def test_malformed_catalog_names_line_column_and_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text(GOOD_CATALOG.replace("40.96", "forty"))
    done = gpuopt("offers", "--catalog", str(bad))
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith(f"gpuopt: error: {bad}:4:12: usd_per_hour: ")


def test_unknown_gpu_is_refused_with_the_known_names(catalog: Path) -> None:
    done = gpuopt("offers", "--catalog", str(catalog), "--gpu", "A1000000")
    assert done.returncode == 2
    assert "unknown GPU model 'A1000000'" in done.stderr and "A100-80GB" in done.stderr


def test_help_does_not_load_cloud_sdks_or_the_store() -> None:
    # pydantic too: the answers' models and the providers' settings load in the commands
    # that read them, so `--help` and a command that needs neither do not pay for them.
    probe = (
        "import sys, runpy; sys.argv = ['gpuopt', '--help']\n"
        "try:\n    runpy.run_module('optimizer.cli', run_name='__main__')\n"
        "except SystemExit:\n    pass\n"
        "heavy = [m for m in ('boto3', 'botocore', 'google.cloud', 'torch', 'pynvml',"
        " 'sqlmodel', 'sqlalchemy', 'fastapi', 'pydantic', 'providers.registry') if m in"
        " sys.modules]\n"
        "print('HEAVY', heavy)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False
    )
    assert "HEAVY []" in done.stdout, done.stdout + done.stderr


POLICY = """\
apiVersion: gpuopt/v1
kind: Policy
name: a100-eu
workload: {gpus: 1, gpu_memory_gib: 30}
placement: {compliance: eu}
"""


def test_offers_ranked_under_a_policy_with_explanations(catalog: Path, tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    done = gpuopt(
        "offers", "--catalog", str(catalog), "--policy", str(policy), "--json", "--explain"
    )
    assert done.returncode == 0, done.stderr
    ranking = json.loads(done.stdout)
    assert [c["offer"]["instance_type"] for c in ranking["candidates"]] == [
        "a2-ultragpu-1g",
        "p4d.24xlarge",
    ]
    assert ranking["rejected_by_rule"] == {"compliance": 2}
    reasons = {r["offer"]["region"]: r["reason"] for r in ranking["rejections"]}
    assert set(reasons) == {"us-east-1", "europe-west2"}
    assert "outside the EU/EEA" in reasons["europe-west2"]
    table = gpuopt("offers", "--catalog", str(catalog), "--policy", str(policy), "--explain")
    assert "compliance" in table.stdout and "europe-west2" in table.stdout
    assert "a2-ultragpu-1g" in table.stdout


def test_offers_with_a_bad_policy_exits_2_with_located_errors(
    catalog: Path, tmp_path: Path
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY + "buffer: 3\n")
    done = gpuopt("offers", "--catalog", str(catalog), "--policy", str(policy))
    assert done.returncode == 2
    assert done.stderr == f"gpuopt: error: {policy}:6:9: buffer: must be < 1\n"


def test_explain_without_a_policy_is_refused(catalog: Path) -> None:
    done = gpuopt("offers", "--catalog", str(catalog), "--explain")
    assert done.returncode == 2 and "--explain needs --policy" in done.stderr


def test_a_named_cloud_without_credentials_is_one_note_and_its_snapshot_rows() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUOPT_GCP", "GOOGLE_"))}
    env["GOOGLE_APPLICATION_CREDENTIALS"] = "/nonexistent/credentials.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "optimizer.cli",
            "offers",
            "--provider",
            "gcp",
            "--json",
            "--limit",
            "0",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.startswith("gpuopt: gcp: disabled (") and done.stderr.count("\n") == 1
    rows = json.loads(done.stdout)
    assert rows and {r["provider"] for r in rows} == {"gcp"}
    assert {r["source"].split(" ")[0] for r in rows} == {"GCP"}  # the snapshot's citation


# -- bad input: every command group refuses it the same way ------------------------------------

EXAMPLE_POLICY = Path(__file__).resolve().parents[1] / "examples" / "local-train-policy.yaml"
BAD_CONFIG = "providers:\n  azure: {}\n"  # line 2, col 3: an unknown provider


def bad_input_cases(tmp: Path) -> dict[str, tuple[list[str], str]]:
    """Per command group: a bad invocation and how its one stderr line starts."""
    (tmp / "bad-config.yaml").write_text(BAD_CONFIG)
    missing = tmp / "missing.yaml"
    return {
        "offers": (
            ["offers", "--catalog", str(tmp / "none.csv")],
            f"gpuopt: error: {tmp / 'none.csv'}: no such file",
        ),
        "policy": (
            ["policy", "schema", "--output", str(tmp / "no-dir" / "schema.json")],
            f"gpuopt: error: --output {tmp / 'no-dir' / 'schema.json'}: No such file or directory",
        ),
        "probe": (
            ["probe", "--quick", "--deep"],
            "gpuopt: error: --quick, --deep and --handover exclude each other",
        ),
        "config": (
            ["config", "check", str(tmp / "bad-config.yaml")],
            f"{tmp / 'bad-config.yaml'}:2:3: providers: unknown provider 'azure'",
        ),
        "daemon": (["daemon", "--config", str(missing)], f"gpuopt: error: {missing}: no such file"),
        "db": (
            ["db", "downgrade", "base"],
            "gpuopt: error: downgrading to base would drop every table; "
            "gpuopt db downgrade does not do that",
        ),
        "jobs": (["jobs", "submit", str(missing)], f"{missing}: no such file"),
        "run": (
            ["run", "--max-price", "0", "--", "echo", "hi"],
            "gpuopt: error: --max-price: Input should be greater than 0",
        ),
        "advise": (
            ["advise", "Not/A-Job"],
            "gpuopt: error: job 'Not/A-Job': a job name is 1-63 lowercase letters",
        ),
        "tco": (
            ["tco", "--gpu", "H100-80GB", "--hours-per-month", "10", "--assumptions", str(missing)],
            f"gpuopt: error: {missing}: no such file",
        ),
        "probes": (
            ["probes", "list", "--limit", "0"],
            "gpuopt: error: --limit: expected a positive number of results, got 0",
        ),
        "costs": (
            ["costs", "--since", "last week"],
            "gpuopt: error: --since: expected a month (2026-03), a date (2026-03-14) or an ISO",
        ),
        "local": (
            ["local", "interrupt", "i-local-9999", "--state-dir", str(tmp / "cloud")],
            f"gpuopt: error: no local cloud at {tmp / 'cloud'} (--state-dir)",
        ),
        "prices": (
            [
                *("prices", "history", "--provider", "aws", "--region", "us-east-1"),
                *("--instance-type", "g5.xlarge", "--since", "last tuesday"),
            ],
            "gpuopt: error: --since: 'last tuesday' is not an ISO 8601 time",
        ),
        "backtest": (
            ["backtest", str(EXAMPLE_POLICY), "--history", str(tmp / "none.csv")],
            f"gpuopt: error: {tmp / 'none.csv'}: no such file",
        ),
        "advise-bid": (
            ["advise-bid", str(EXAMPLE_POLICY), "--target-availability", "0.95"],
            "gpuopt: error: give one of --history FILE or --from-store",
        ),
        "checkpoint": (
            ["checkpoint", "commit", str(tmp / "no-such-step")],
            f"gpuopt: error: {tmp / 'no-such-step'}: not a folder",
        ),
        "progress": (
            ["progress", "10", "--total", "0"],
            "gpuopt: error: total must be between 1 and 2**62, not 0",
        ),
        "standby": (
            ["standby", "wait", "--timeout", "0"],
            "gpuopt: error: --timeout must be above 0, not 0",
        ),
        "machines": (
            ["machines", "drain", "gpu-a", "--in", "soon"],
            "gpuopt: error: --in: 'soon' is not a duration",
        ),
        "agent": (
            ["agent", "run"],
            "gpuopt: error: missing environment variable(s): "
            "GPUOPT_DAEMON_URL, GPUOPT_AGENT_TOKEN, GPUOPT_ATTEMPT_KEY",
        ),
    }


GROUPS = [
    "offers",
    "policy",
    "probe",
    "config",
    "daemon",
    "db",
    "jobs",
    "run",
    "local",
    "agent",
    "prices",
    "costs",
    "advise",
    "probes",
    "tco",
    "backtest",
    "advise-bid",
    "checkpoint",
    "progress",
    "standby",
    "machines",
]


@pytest.fixture
def cli_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in list(os.environ):
        if name.startswith("GPUOPT_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("GPUOPT_DATA_DIR", str(tmp_path / "data"))
    return tmp_path


@pytest.mark.parametrize("group", GROUPS)
def test_bad_input_exits_2_with_one_line_naming_the_problem(group: str, cli_env: Path) -> None:
    from typer.testing import CliRunner

    from optimizer.cli import app

    args, line = bad_input_cases(cli_env)[group]
    result = CliRunner().invoke(app, args)
    assert isinstance(result.exception, SystemExit), result.exception  # no traceback
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1 and result.stderr.startswith(line), result.stderr


def test_every_command_group_has_a_bad_input_case() -> None:
    from optimizer.cli import app

    names = {c.name for c in app.registered_commands} | {g.name for g in app.registered_groups}
    assert names - {"version"} == set(GROUPS)  # `version` takes no input


def test_jobs_a_request_the_daemon_refuses_is_bad_input_a_daemon_failure_is_not(
    cli_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pytest_httpserver import HTTPServer
    from typer.testing import CliRunner

    from optimizer.cli import app

    monkeypatch.setenv("GPUOPT_API_TOKEN", "t")
    with HTTPServer() as server:
        server.expect_request("/jobs/nope").respond_with_json({"detail": "no job 'nope'"}, 404)
        server.expect_request("/jobs").respond_with_json({"detail": "store unavailable"}, 503)
        refused = CliRunner().invoke(app, ["jobs", "show", "nope", "--api", server.url_for("")])
        failed = CliRunner().invoke(app, ["jobs", "list", "--api", server.url_for("")])
    assert (refused.exit_code, refused.stderr) == (2, "gpuopt: error: 404: no job 'nope'\n")
    assert (failed.exit_code, failed.stderr) == (1, "gpuopt: error: 503: store unavailable\n")


@pytest.mark.parametrize(
    ("args", "start"),
    [
        (["daemon", "--port", "0"], "gpuopt: error: database_url has"),
        # `config check` names the variable the URL came from.
        (["config", "check"], "GPUOPT_DATABASE_URL: database_url: has"),
        (["db", "current"], "gpuopt: error: database_url has"),
    ],
)
def test_a_bad_database_url_is_bad_input(args: list[str], start: str, tmp_path: Path) -> None:
    # A real process: `gpuopt daemon` sets up logging for the whole process before it fails.
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUOPT_")}
    env |= {"GPUOPT_DATA_DIR": str(tmp_path), "GPUOPT_DATABASE_URL": "mysql://a:hunter2@db/g"}
    done = subprocess.run(
        [sys.executable, "-m", "optimizer.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"{start} unsupported scheme 'mysql'")
    assert done.stderr.count("\n") == 1 and "hunter2" not in done.stderr


def test_a_ranking_answer_with_a_rule_the_cli_does_not_know_keeps_its_count(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A rule another package registered in the daemon is not in the CLI's rulebook: filtering
    the daemon's ranking here keeps its count, in the answer's order, in the JSON and table."""
    assert "toy.vcpus_per_gpu" not in {rule.id for rule in rulebook.current()}
    euc, use = offer(), offer(region="us-east-1", zone="use1-az1")
    rejected = [
        ("market", euc, "on_demand not allowed (markets: spot)"),
        ("toy.vcpus_per_gpu", euc, "16 vCPUs for 8 GPUs < 4 per GPU"),
        ("toy.vcpus_per_gpu", use, "16 vCPUs for 8 GPUs < 4 per GPU"),
        ("gpu_count", euc, "2 GPUs < 4 needed"),
    ]
    answer = {
        "policy": "p",
        "evaluated_at": "2026-04-23T12:00:00Z",
        "dtype": "bf16",
        "candidates": [],
        "candidate_count": 0,
        "rejected_by_rule": {"market": 1, "toy.vcpus_per_gpu": 2, "gpu_count": 1},
        "rejections": [
            {"rule": rule, "reason": reason, "offer": o.to_dict()} for rule, o, reason in rejected
        ],
    }
    view = RankingView.from_api(answer)
    everything = view.select(OfferQuery(market=Market.ON_DEMAND))
    assert list(everything.rejection_counts.items()) == [
        ("market", 1),
        ("toy.vcpus_per_gpu", 2),
        ("gpu_count", 1),
    ]
    assert everything.total == 4
    eu = view.select(OfferQuery(region_globs=("eu-*",)))
    assert eu.rejection_counts == {"market": 1, "toy.vcpus_per_gpu": 1, "gpu_count": 1}
    assert list(eu.rejection_counts) == ["market", "toy.vcpus_per_gpu", "gpu_count"]

    render(eu, limit=0, explain=True, as_json=True, source="daemon")
    shown = json.loads(capsys.readouterr().out)
    assert shown["rejected_by_rule"] == {"market": 1, "toy.vcpus_per_gpu": 1, "gpu_count": 1}
    render(eu, limit=0, explain=True, as_json=False, source="daemon")
    table = capsys.readouterr().out
    assert "3 rejected offers" in table
    assert "toy.vcpus_per_gpu" in table and "16 vCPUs for 8 GPUs < 4 per GPU" in table
