"""docs/extending.md, followed to the letter: the `gpuopt-toy` package it shows (a provider, an
alert channel and a recovery strategy) is built from the doc's own blocks, registered through a
temporary distribution on the path (its `entry_points.txt` as pip would write it), and each
plug-in runs through the daemon's parts: the config, the engine, the alert outbox and the
state machine. The toy rule of the doc's rule section is imported from its block, which
registers it in the rulebook, and ranks offers in the engine. gpuopt is not edited."""

from __future__ import annotations

import importlib
import re
import sys
import tomllib
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from optimizer.alerts import channels
from optimizer.alerts.channels import build_notifiers
from optimizer.alerts.outbox import Emitter
from optimizer.alerts.routing import Router
from optimizer.common import plugins
from optimizer.costs import rule_for
from optimizer.daemon.config import ConfigError, load_config
from optimizer.daemon.loops.deliver import DeliverLoop
from optimizer.daemon.providers import provider_settings
from optimizer.jobs import recovery
from optimizer.jobs.machine import AttemptView, JobState, JobView, decide
from optimizer.model import EventKind
from optimizer.store import Store
from policies import rulebook
from policies.engine import RULES, evaluate
from policies.loader import PolicyError, parse_policy
from providers import registry
from tests.helpers import row_engine
from tests.helpers.engine import T0, offer, policy

pytestmark = pytest.mark.usefixtures("daemon_env")

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "extending.md"
NOW = datetime(2026, 11, 30, 12, tzinfo=UTC)
POLICY = """\
apiVersion: gpuopt/v1
kind: Policy
name: toy
workload: {gpus: 1, gpu_memory_gib: 16}
markets: [spot]
placement: {providers: [toy]}
recovery: {strategy: toy-stop}
"""


def doc_block(name: str) -> str:
    """The fenced block that follows `<!-- toy: NAME -->` in docs/extending.md."""
    found = re.search(
        rf"<!-- toy: {re.escape(name)} -->\n```[a-z]*\n(.*?)\n```", DOC.read_text(), re.S
    )
    assert found, f"docs/extending.md has no block for {name}"
    return found.group(1) + "\n"


def install(site: Path) -> None:
    """What `pip install ./gpuopt-toy` leaves in site-packages: the module, and a dist-info
    whose METADATA and entry_points.txt come from the package's pyproject.toml."""
    project = tomllib.loads(doc_block("pyproject.toml"))["project"]
    (site / "gpuopt_toy.py").write_text(doc_block("gpuopt_toy.py"))
    info = site / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n"
    )
    groups = project["entry-points"]
    (info / "entry_points.txt").write_text(
        "".join(
            f"[{group}]\n" + "".join(f"{name} = {value}\n" for name, value in points.items())
            for group, points in groups.items()
        )
    )


def reload_all() -> None:
    registry.reload()
    channels.reload()
    recovery.reload()


@pytest.fixture
def toy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """gpuopt-toy installed for the length of a test, then gone."""
    site = tmp_path / "site-packages"
    site.mkdir()
    install(site)
    monkeypatch.syspath_prepend(str(site))
    reload_all()
    try:
        yield
    finally:
        monkeypatch.undo()
        sys.modules.pop("gpuopt_toy", None)
        reload_all()


def test_the_doc_blocks_are_the_package_and_nothing_is_installed_without_it() -> None:
    assert "toy" not in registry.names()
    assert "toy-pager" not in channels.channel_types()
    assert "toy-stop" not in recovery.strategies()
    with pytest.raises(PolicyError, match="must be an installed provider"):
        parse_policy(POLICY)


def test_the_toy_provider_is_found_configured_priced_and_its_offers_rank(
    toy: None, tmp_path: Path
) -> None:
    assert "toy" in registry.names() and "toy" in plugins.names(plugins.PROVIDERS)
    path = tmp_path / "gpuopt.yaml"
    path.write_text("providers:\n  local: {enabled: false}\n  toy: {price_scale: 0.5}\n")
    config = load_config(path)
    section = config.providers["toy"]
    assert type(section).__name__ == "ToyConfig"  # the toy's own model validated its section
    source = registry.build("toy", provider_settings(section, data_dir=tmp_path, clock=lambda: NOW))
    ranking = evaluate(parse_policy(POLICY), source.fetch_offers(), NOW)
    ranked = [(c.offer.provider, c.offer.instance_type) for c in ranking.candidates]
    assert ranked == [("toy", "toy.l4"), ("toy", "toy.a10")]  # cheapest first
    assert ranking.candidates[0].offer.usd_per_hour == pytest.approx(0.8 * 0.5 * 0.4)
    assert rule_for("toy").disk_type == "toy-ssd"  # its own billing rule, not AWS's
    assert registry.get("toy").focus_names().issuer == "Toy Cloud"

    path.write_text("providers:\n  toy: {project: p}\n")  # GCP's key
    with pytest.raises(ConfigError, match=r"providers\.toy\.project: unknown field"):
        load_config(path)


def test_the_toy_channel_is_configured_and_receives_an_alert(toy: None, tmp_path: Path) -> None:
    path = tmp_path / "gpuopt.yaml"
    path.write_text(
        "alerts:\n"
        "  channels:\n"
        "    pager: {type: toy-pager, routing_key: rk-0123456789}\n"
        "  routes:\n"
        "    - {kinds: ['job.*'], channels: [pager]}\n"
    )
    config = load_config(path)
    assert "rk-0123456789" in config.secrets()  # kept out of logs and API answers
    store = Store(f"sqlite:///{tmp_path / 'toy.sqlite'}", clock=lambda: NOW)
    store.create_all()
    try:
        emitter = Emitter(store.events, Router(config.alerts.routes, config.alerts.channels))
        emitter.emit(EventKind.JOB_FAILED, "train failed", severity="error")
        with httpx.Client() as client:
            notifiers = build_notifiers(config.alerts.channels, client, lambda: NOW)
            report = DeliverLoop(store, notifiers, lambda: NOW + timedelta(seconds=1)).run_once()
    finally:
        store.close()
    assert report.delivered == 1
    pager: Any = notifiers["pager"]
    assert [(a.kind, a.message) for a in pager.sent] == [("job.failed", "train failed")]

    path.write_text("alerts:\n  channels:\n    pager: {type: toy-pager, url: 'https://x'}\n")
    with pytest.raises(ConfigError, match=r"alerts\.channels\.pager\.url: unknown field"):
        load_config(path)


def test_the_toy_strategy_is_named_by_a_policy_and_gives_up_in_the_state_machine(
    toy: None,
) -> None:
    strategy = recovery.strategy_for(parse_policy(POLICY))
    assert strategy.name == "toy-stop"
    job = JobView(id=7, name="train", state=JobState.RUNNING)
    gone = AttemptView(
        number=1,
        key="7-1",
        pool=("toy", "toy-east-1", None, "toy.l4", "spot"),
        launched_at=NOW - timedelta(minutes=5),
        registered=True,
        probe_status="pass",
        job_started=True,
        instance_gone=True,
        preempted=True,
    )
    decision = decide(job, gone, now=NOW, strategy=strategy)
    assert decision.state is JobState.FAILED and not decision.launches
    assert "toy-stop: preempted ends the job" in decision.reason


def test_the_toy_rule_from_the_doc_rejects_with_its_words_and_leaves_the_others_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pol = policy(placement={"regions": {"allow": ["eu-*"]}}, workload={"gpus": 4})
    offers = [
        offer(vcpus=16),  # 16 vCPUs for 8 GPUs: fails only the toy rule
        offer(vcpus=16, region="us-east-1", zone="use1-az1"),  # region is checked first
        offer(vcpus=4, gpu_count=2),  # fails both: the toy rule is checked before gpu_count
        offer(vcpus=96, gpu_count=2),  # gpu_count's own, after the toy rule
        offer(),  # 96 vCPUs for 8 GPUs: a candidate
    ]
    before = evaluate(pol, offers, T0)
    assert [r.rule for r in before.rejections] == ["region", "gpu_count", "gpu_count"]

    (tmp_path / "toy_rule.py").write_text(doc_block("toy_rule.py"))
    monkeypatch.syspath_prepend(str(tmp_path))
    module: Any = importlib.import_module("toy_rule")  # registers the rule, as the doc says
    try:
        rule_id = module.VcpusPerGpu.id
        ids = [r.id for r in rulebook.current()]
        assert ids.index(rule_id) == ids.index("gpu_count") - 1
        ranking = evaluate(pol, offers, T0)
        assert [c.offer for c in ranking.candidates] == [offer()]
        assert [(r.offer, r.rule, r.reason) for r in ranking.rejections] == [
            (offers[1], "region", before.rejected("region")[0].reason),
            (offers[0], rule_id, "16 vCPUs for 8 GPUs < 4 per GPU"),
            (offers[2], rule_id, "4 vCPUs for 2 GPUs < 4 per GPU"),
            (offers[3], "gpu_count", "2 GPUs < 4 needed"),
        ]
        assert ranking.rejection_counts() == {"region": 1, rule_id: 2, "gpu_count": 1}
        # The row engine runs the rule's `why` alone: the same verdicts as its `mask`.
        oracle = row_engine.evaluate(pol, offers, T0)
        assert list(oracle.candidates) == list(ranking.candidates)
        assert [(r.offer, r.rule, r.reason) for r in oracle.rejections] == [
            (r.offer, r.rule, r.reason) for r in ranking.rejections
        ]
    finally:
        rulebook.unregister(module.VcpusPerGpu.id)
        sys.modules.pop("toy_rule", None)
    assert tuple(r.id for r in rulebook.current()) == RULES
    after = evaluate(pol, offers, T0)
    assert [(r.offer, r.rule, r.reason) for r in after.rejections] == [
        (r.offer, r.rule, r.reason) for r in before.rejections
    ]
