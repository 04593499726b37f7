"""Which commands ask a live provider for committed offers (they cost calls of their own):
`gpuopt tco` always, `gpuopt offers` when the committed market is wanted, by `--market` or by
the policy ranked; never otherwise. A provider defined in the test records what it was
asked."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest
from typer.testing import CliRunner

from optimizer.cli import app
from optimizer.model import Interconnect, Market, Offer, PaymentOption
from providers import registry
from providers.base import ProviderSettings
from providers.registry import Capabilities, ProviderEntry

AT = datetime(2026, 11, 1, tzinfo=UTC)
NO_DAEMON = "http://127.0.0.1:9"  # nothing listens: the commands rank here


class RecordingSource:
    """Two offers of one machine, the committed one only when asked for commitments."""

    name = "rec"
    problems: tuple[str, ...] = ()

    def __init__(self, commitments: bool) -> None:
        self.commitments = commitments

    def fetch_offers(self, regions: object = None) -> list[Offer]:
        base = Offer(
            "rec",
            "us-east-1",
            None,
            "p5.48xlarge",
            "H100-80GB",
            8,
            80.0,
            192,
            2048.0,
            Interconnect.NVLINK,
            Market.ON_DEMAND,
            40.0,
            AT,
        )
        if not self.commitments:
            return [base]
        return [
            base,
            replace(
                base,
                market=Market.COMMITTED,
                usd_per_hour=28.0,
                term_years=1,
                payment_option=PaymentOption.NO_UPFRONT,
                upfront_usd=0.0,
            ),
        ]


@pytest.fixture
def asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[bool]]:
    """The `commitments` setting of every source the commands built."""
    monkeypatch.setenv("GPUOPT_DATA_DIR", str(tmp_path / "data"))
    seen: list[bool] = []

    def build(settings: ProviderSettings) -> RecordingSource:
        seen.append(settings.commitments)
        return RecordingSource(settings.commitments)

    entry = ProviderEntry("rec", Capabilities(live_offers=True, commitments=True), build)
    with registry.registered(entry):
        yield seen


def offers(*args: str) -> list[dict[str, object]]:
    result = CliRunner().invoke(app, ["offers", "--provider", "rec", "--json", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_offers_ask_for_commitments_only_for_the_committed_market(asked: list[bool]) -> None:
    assert [o["market"] for o in offers()] == ["on_demand"]
    rows = offers("--market", "committed")
    assert [(o["market"], o["usd_per_hour"], o["term_years"]) for o in rows] == [
        ("committed", 28.0, 1)
    ]
    assert asked == [False, True]


def test_a_policy_listing_committed_asks_for_commitments(asked: list[bool], tmp_path: Path) -> None:
    policy = tmp_path / "reserved.yaml"
    policy.write_text(
        textwrap.dedent(
            """\
            apiVersion: gpuopt/v1
            kind: Policy
            name: reserved-first
            workload: {type: training, gpus: 8, gpu_memory_gib: 60}
            markets: [committed, spot]
            """
        )
    )
    spot_only = tmp_path / "spot.yaml"
    spot_only.write_text(policy.read_text().replace("[committed, spot]", "[spot]"))
    for path in (policy, spot_only):
        result = CliRunner().invoke(
            app, ["offers", "--provider", "rec", "--policy", str(path), "--api", NO_DAEMON]
        )
        assert result.exit_code == 0, result.output
    assert asked == [True, False]


def test_tco_always_asks_for_commitments_and_prices_the_offered_rate(asked: list[bool]) -> None:
    result = CliRunner().invoke(
        app,
        ["tco", "--provider", "rec", "--gpu", "H100-80GB", "--hours-per-month", "500", "--json"],
    )
    assert result.exit_code == 0, result.output
    assert asked == [True]
    options = {o["name"]: o for o in json.loads(result.stdout)["options"]}
    one_year = next(o for name, o in options.items() if name.startswith("committed 1y"))
    # 28 $/h x 8,760 h x 3 one-year terms, every hour paid
    assert one_year["total_usd"] == pytest.approx(28 * 8760 * 3)
    assert not any("estimated" in n for n in one_year["notes"])


# --- the snapshot says it has no committed rows, and why -----------------------------------

LACKS = "the snapshot has no committed rows for aws or gcp: its source"


@pytest.fixture
def no_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GPUOPT_DATA_DIR", str(tmp_path / "data"))
    return tmp_path


def test_offers_for_the_committed_market_from_the_snapshot_say_what_it_lacks(
    no_env: Path,
) -> None:
    wanted = CliRunner().invoke(app, ["offers", "--market", "committed", "--json"])
    assert wanted.exit_code == 0, wanted.output
    assert json.loads(wanted.stdout) == []
    assert LACKS in wanted.stderr and "Reserved Instance" in wanted.stderr
    plain = CliRunner().invoke(app, ["offers", "--json"])
    assert plain.exit_code == 0 and "committed rows" not in plain.stderr


def test_explaining_a_committed_policy_over_the_snapshot_says_what_it_lacks(
    no_env: Path,
) -> None:
    policy = no_env / "reserved.yaml"
    policy.write_text(
        "apiVersion: gpuopt/v1\nkind: Policy\nname: reserved-first\n"
        "workload: {type: training, gpus: 8, gpu_memory_gib: 60}\n"
        "markets: [committed, on_demand]\n"
    )
    result = CliRunner().invoke(
        app, ["offers", "--policy", str(policy), "--explain", "--api", NO_DAEMON]
    )
    assert result.exit_code == 0, result.output
    assert LACKS in result.stderr


def test_tco_over_the_snapshot_notes_the_missing_commitments_and_the_estimate(
    no_env: Path,
) -> None:
    result = CliRunner().invoke(
        app, ["tco", "--gpu", "A100-80GB", "--gpus", "8", "--hours-per-month", "500", "--json"]
    )
    assert result.exit_code == 0, result.output
    notes = json.loads(result.stdout)["notes"]
    assert any(n.startswith("no committed offer for A100-80GB from snapshot") for n in notes)
    assert any(n.startswith(LACKS) for n in notes)
