"""The local cloud: offers from the bundled snapshot with simulated spot prices, instances as
local processes, a metadata endpoint shaped like AWS IMDSv2 and GCP's, injected interruptions
and launch failures. gpuopt's embedded default; see `providers/local/cloud.py`."""

from pydantic import Field

from optimizer import hardware
from providers import aws
from providers.base import ProviderDisabled, ProviderSettings
from providers.config import ProviderConfig
from providers.facts import FocusNames
from providers.local.cloud import LocalCloud
from providers.local.faults import FAULTS
from providers.local.history import DEFAULT_DAYS, MAX_DAYS
from providers.local.metadata import MetadataServer
from providers.local.prices import SIMULATED, SpotWalk, local_offers
from providers.local.state import InstanceRecord, Interruption, StateDir
from providers.registry import Capabilities, ProviderEntry

__all__ = [
    "ENTRY",
    "FAULTS",
    "SIMULATED",
    "STATE_DIR",
    "InstanceRecord",
    "Interruption",
    "LocalCloud",
    "LocalConfig",
    "MetadataServer",
    "SpotWalk",
    "StateDir",
    "build",
    "local_offers",
]

STATE_DIR = "local-cloud"  # below the daemon's data directory


class LocalConfig(ProviderConfig):
    """The local cloud's section: the common keys and how much simulated price history a
    fresh daemon writes (providers/local/history.py)."""

    history_days: int = Field(
        DEFAULT_DAYS,
        ge=0,
        le=MAX_DAYS,
        description="Days of the local cloud's simulated prices a fresh daemon writes into its "
        "store before the first poll's (0: none).",
    )


def build(settings: ProviderSettings) -> LocalCloud:
    """The daemon's embedded local cloud, its state in `<data dir>/local-cloud` (the
    registry's builder)."""
    if settings.data_dir is None:
        raise ProviderDisabled("the local cloud needs a data directory", provider="local")
    clock = settings.clock
    return LocalCloud(settings.data_dir / STATE_DIR, clock=lambda: clock().timestamp())


# The local cloud, as the `gpuopt.providers` entry point `local` names it. It bills as AWS
# does, so its numbers exercise the same rules; its types are the snapshot's AWS and GCP
# types (their fabric looked up under either cloud), its processes share no GPU link.
ENTRY = ProviderEntry(
    "local",
    Capabilities(
        launch=True, live_offers=True, watcher="aws-imds", agent_on_host=True, hosted=True
    ),
    build,
    billing=aws.BILLING,
    hardware=hardware.LOCAL_FACTS,
    settings=LocalConfig,
    focus=FocusNames("gpuopt local cloud", "Local instances", "Local volumes"),
)
