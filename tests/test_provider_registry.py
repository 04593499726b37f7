"""The provider registry: each provider declares what it can do once, everything above the
providers asks it, and a provider defined here, registered through the public function with
its rows added to the region table, is polled and launched on by the real daemon without any
other change."""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from optimizer import hardware
from optimizer.agent.imds import WATCHERS
from optimizer.cli.sources import live_providers
from optimizer.costs import rule_for
from optimizer.daemon.config import ConfigError, ProviderConfig, load_config
from optimizer.daemon.providers import ProviderHandle, provider_secrets
from optimizer.hardware import UnknownCloudError
from optimizer.model import Interconnect, Market, Offer
from policies import regions
from providers import aws, registry
from providers.aws import AwsConfig
from providers.base import (
    HostedCloud,
    InterruptionQueue,
    Launcher,
    OffersNotifier,
    OfferSource,
    PlacementOwner,
    ProviderDisabled,
    ProviderSettings,
)
from providers.facts import FocusNames
from providers.gcp import GcpConfig
from providers.local import LocalCloud
from providers.registry import Capabilities, ProviderEntry, RegistryError
from tests.helpers import api, make_config, running, wait_until, write_policy

pytestmark = pytest.mark.usefixtures("daemon_env")


# -- the built-in providers ----------------------------------------------------------------


def test_the_built_in_providers_and_what_each_declares() -> None:
    assert {"local", "aws", "gcp"} <= set(registry.names())  # found through entry points
    local, aws, gcp = (registry.capabilities(n) for n in ("local", "aws", "gcp"))
    assert local == Capabilities(
        launch=True, live_offers=True, watcher="aws-imds", agent_on_host=True, hosted=True
    )
    assert aws.launch and aws.interruption_queue and aws.placement_scores and aws.live_offers
    assert (aws.watcher, gcp.watcher) == ("aws-imds", "gcp-metadata")
    assert gcp.launch and gcp.live_offers and not gcp.interruption_queue
    assert not gcp.placement_scores
    assert aws.commitments and gcp.commitments and not local.commitments  # committed offers
    assert aws.gang_placement and gcp.gang_placement and not local.gang_placement
    assert local.hosted and not aws.hosted and not gcp.hosted  # runs inside the leader
    live = tuple(n for n in registry.names() if registry.capabilities(n).live_offers)
    assert live_providers() == live  # what `gpuopt offers --provider` asks
    assert {"local", "aws", "gcp"} <= set(live)


def built(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> OfferSource:
    """Build a built-in provider through the registry, with just enough environment that it
    can (no call leaves this machine: clients are made on first use)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "example-secret")
    monkeypatch.setenv("GPUOPT_GCP_PROJECT", "example-project")
    monkeypatch.setenv("GPUOPT_GCP_COMPUTE_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("GPUOPT_GCP_BILLING_ENDPOINT", "http://127.0.0.1:9")
    return registry.build(name, ProviderSettings(data_dir=tmp_path))


@pytest.mark.parametrize("name", registry.names())
def test_each_installed_provider_implements_what_it_declares(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if name == "gcp":
        pytest.importorskip("google.cloud.compute_v1")
    source = built(name, tmp_path, monkeypatch)
    entry = registry.get(name)
    assert source.name == name
    assert isinstance(source, OfferSource)
    assert isinstance(source, Launcher) is entry.capabilities.launch
    assert isinstance(source, InterruptionQueue) is entry.capabilities.interruption_queue
    assert (entry.launcher(source) is source) is entry.capabilities.launch
    assert (entry.interruption_queue(source) is source) is entry.capabilities.interruption_queue
    assert isinstance(source, PlacementOwner) is entry.capabilities.gang_placement
    assert (entry.placement_owner(source) is source) is entry.capabilities.gang_placement
    assert isinstance(source, HostedCloud) is entry.capabilities.hosted
    assert (entry.hosted(source) is source) is entry.capabilities.hosted
    assert isinstance(source, OffersNotifier) is entry.capabilities.offers_follow_launches
    notifier = entry.offers_notifier(source)
    assert (notifier is source) is entry.capabilities.offers_follow_launches
    launcher = entry.launcher(source)
    assert launcher is not None
    launcher.close()


def test_every_declared_watcher_kind_is_one_the_agent_has() -> None:
    kinds = {e.capabilities.watcher for e in registry.entries().values()}
    assert kinds - {None} <= set(WATCHERS)


def test_providers_that_cannot_run_here_say_why() -> None:
    with pytest.raises(ProviderDisabled, match="data directory"):
        registry.build("local", ProviderSettings())  # its state lives in a data directory


def test_credentials_come_from_the_registry() -> None:
    env = {"AWS_SECRET_ACCESS_KEY": "a-secret", "GPUOPT_GCP_BILLING_API_KEY": "a-key", "X": "y"}
    assert provider_secrets(env) == ["a-secret", "a-key"]


# -- entries and lookups -------------------------------------------------------------------


def no_build(settings: ProviderSettings) -> OfferSource:
    raise ProviderDisabled("not here", provider="test")


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (lambda: ProviderEntry("Acme Cloud", Capabilities(), no_build), "a name is 1-32"),
        (lambda: ProviderEntry("acme", Capabilities(launch=True), no_build), "watcher kind"),
        (
            lambda: ProviderEntry("acme", Capabilities(watcher="AWS IMDS"), no_build),
            "not a lowercase word",
        ),
        (lambda: registry.register(ProviderEntry("aws", Capabilities(), no_build)), "already"),
        (
            lambda: registry.get("azure"),
            f"unknown provider 'azure'; installed: {', '.join(registry.names())}",
        ),
    ],
)
def test_bad_entries_and_unknown_names_are_errors(entry: Any, message: str) -> None:
    before = registry.names()
    with pytest.raises(RegistryError, match=message):
        entry()
    assert registry.names() == before


def test_a_provider_without_a_capability_is_never_asked_for_it() -> None:
    offers_only = ProviderEntry("catalog-only", Capabilities(), no_build)
    with registry.registered(offers_only):
        assert registry.names()[-1] == "catalog-only"
        handle = ProviderHandle(
            "catalog-only", ProviderConfig(), lambda: no_build(ProviderSettings())
        )
        assert handle.launcher() is None  # not even built: the registry answered
        assert handle.interruption_queue() is None
    assert registry.find("catalog-only") is None


@pytest.mark.parametrize(
    ("section", "message"),
    [
        (
            "azure: {}",
            f"3: providers: unknown provider 'azure'; installed: {', '.join(registry.names())}",
        ),
        ("gcp: {placement_scores: true}", "9: providers.gcp.placement_scores: unknown field"),
        (
            "local: {interruption_queue_url: 'https://sqs.example/q'}",
            "11: providers.local.interruption_queue_url: unknown field",
        ),
        ("aws: {project: p}", "9: providers.aws.project: unknown field"),
        ("gcp: {project: [p]}", "18: providers.gcp.project: must be text"),
    ],
)
def test_each_provider_section_is_validated_with_the_providers_own_model(
    tmp_path: Path, section: str, message: str
) -> None:
    path = tmp_path / "gpuopt.yaml"
    path.write_text(f"providers:\n  {section}\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert f"{path}:2:{message}" in str(caught.value)
    path.write_text(
        "providers:\n  aws: {placement_scores: true, interruption_queue_url: q}\n"
        "  gcp: {project: example}\n"
    )
    loaded = load_config(path).providers
    assert isinstance(loaded["aws"], AwsConfig) and loaded["aws"].placement_scores
    assert loaded["aws"].interruption_queue_configured
    assert isinstance(loaded["gcp"], GcpConfig) and loaded["gcp"].project == "example"


def test_the_provider_settings_variables_keep_their_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "gpuopt.yaml"
    path.write_text("providers:\n  aws: {}\n  gcp: {}\n")
    monkeypatch.setenv("GPUOPT_PROVIDERS__AWS__INTERRUPTION_QUEUE_URL", "https://sqs.example/q")
    monkeypatch.setenv("GPUOPT_PROVIDERS__GCP__PROJECT", "from-env")
    loaded = load_config(path).providers
    assert isinstance(loaded["aws"], AwsConfig)
    assert loaded["aws"].interruption_queue_url == "https://sqs.example/q"
    assert isinstance(loaded["gcp"], GcpConfig) and loaded["gcp"].project == "from-env"


# -- what each provider knows ----------------------------------------------------------------


@pytest.mark.parametrize("name", registry.names())
def test_each_installed_provider_declares_its_billing_hardware_and_focus_names(name: str) -> None:
    entry = registry.get(name)
    assert rule_for(name) is entry.billing_rule()
    facts = entry.hardware_facts()
    assert facts.interconnect("any-type", 1) is Interconnect.NONE
    assert facts.fabric("any-type") is not None
    names = entry.focus_names()
    assert names.issuer and names.compute and names.storage


def test_an_unknown_provider_is_an_error_not_another_clouds_facts() -> None:
    installed = ", ".join(registry.names())
    with pytest.raises(RegistryError, match=f"unknown provider 'azure'; installed: {installed}"):
        rule_for("azure")  # it billed as AWS did
    with pytest.raises(UnknownCloudError, match="no hardware facts for provider 'azure'"):
        hardware.instance_interconnect("azure", "nd96asr_v4", 8)  # it was PCIe
    bare = ProviderEntry("bare", Capabilities(), no_build)
    with registry.registered(bare):
        with pytest.raises(RegistryError, match="provider 'bare' declares no billing rule"):
            rule_for("bare")
        with pytest.raises(RegistryError, match="declares no hardware facts"):
            bare.hardware_facts()
        with pytest.raises(RegistryError, match="declares no FOCUS names"):
            bare.focus_names()


# -- a provider the tests define -----------------------------------------------------------

ACME_ROWS = (
    "acme,eu-west-1,Dublin,IE,europe,https://example.com/acme/regions\n"
    "acme,us-east-1,Virginia,US,north-america,https://example.com/acme/regions\n"
)
POLICY = """\
apiVersion: gpuopt/v1
kind: Policy
name: acme-eu
workload: {gpus: 1, gpu_memory_gib: 12}
markets: [spot, on_demand]
placement: {providers: [acme], compliance: eu}
"""


class AcmeCloud(LocalCloud):
    """A cloud only these tests know: instances are local processes (the local cloud's
    machinery), offers and instances are labelled `acme`."""

    name = "acme"

    def fetch_offers(self, regions: Sequence[str] | None = None) -> list[Offer]:
        return [
            replace(o, provider=self.name, source="acme") for o in super().fetch_offers(regions)
        ]


@pytest.fixture
def acme(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[AcmeCloud]]:
    """Register `acme` (its clouds, as the daemon builds them, land in the list) and add its
    rows to the region table; both undone afterwards."""
    clouds: list[AcmeCloud] = []

    def build(settings: ProviderSettings) -> AcmeCloud:
        assert settings.data_dir is not None
        cloud = AcmeCloud(settings.data_dir / "acme", tick_s=0.05, grace_s=2.0)
        clouds.append(cloud)
        return cloud

    table = regions.table_text() + ACME_ROWS
    monkeypatch.setattr(regions, "table_text", lambda: table)
    regions.reload()
    entry = ProviderEntry(
        "acme",
        Capabilities(launch=True, watcher="aws-imds", agent_on_host=True),
        build,
        billing=aws.BILLING,
        hardware=hardware.LOCAL_FACTS,
        focus=FocusNames("Acme", "Acme instances", "Acme volumes"),
    )
    try:
        with registry.registered(entry):
            yield clouds
    finally:
        for cloud in clouds:
            cloud.kill_all()
            cloud.close()
        monkeypatch.undo()
        regions.reload()


@pytest.mark.slow
def test_the_daemon_polls_and_launches_on_a_provider_it_was_never_told_about(
    tmp_path: Path, acme: list[AcmeCloud]
) -> None:
    assert "acme" in regions.providers()
    write_policy(tmp_path / "policies", "acme-eu.yaml", POLICY)
    config = make_config(
        tmp_path,
        policy_dir=tmp_path / "policies",
        providers={
            "local": {"enabled": False},
            "acme": {"regions": ["eu-west-1"], "spot_interval_s": 3600},
        },
        loops={"reconcile_s": 0.25},
    )
    with running(config, sources=None) as daemon:
        assert set(daemon.handles) == {"acme"}
        assert "poll:acme:spot" in daemon.scheduler.names
        assert not [n for n in daemon.scheduler.names if n.startswith("queue:")]
        for poll in daemon.polls:
            poll.run_once()
        offers = daemon.store.prices.latest_offers(provider="acme")
        assert offers and {o.region for o in offers} == {"eu-west-1"}
        assert {o.market for o in offers} == {Market.SPOT, Market.ON_DEMAND}
        body = {
            "name": "hello",
            "policy": "acme-eu",
            "run": f"{sys.executable} -c 'print(42)'",
            "checkpoint_dir": str(tmp_path / "ckpt"),
            "probes": "none",
        }
        with api(daemon) as client:
            assert client.post("/jobs", json=body).status_code == 201

            def state() -> Any:
                return client.get("/jobs/hello").json()["state"]

            wait_until(lambda: state() == "succeeded", 60, "the job to finish on acme")
            job_id = client.get("/jobs/hello").json()["id"]
        attempts = daemon.store.jobs.attempts(job_id)
    assert {(a.provider, a.region) for a in attempts} == {("acme", "eu-west-1")}
    last = attempts[-1]
    assert last.exit_code == 0 and last.instance_id is not None
    [cloud] = acme
    assert last.instance_id in {r.id for r in cloud.instances()}
    console = (cloud.state.disk(last.instance_id) / "console.log").read_text()
    assert f"registering {last.key} as {last.instance_id}" in console  # the real agent ran


def test_no_test_fake_ships_in_the_product_packages() -> None:
    root = Path(__file__).resolve().parents[1]
    shipped = [
        str(path.relative_to(root))
        for top in ("optimizer", "providers", "policies")
        for path in (root / top).rglob("*.py")
        if "fake" in path.stem
    ]
    assert shipped == []  # test fakes live under tests/helpers/
