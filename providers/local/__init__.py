"""The local cloud: offers from the bundled snapshot with simulated spot prices, instances as
local processes, a metadata endpoint shaped like AWS IMDSv2 and GCP's, injected interruptions
and launch failures. gpuopt's embedded default; see `providers/local/cloud.py`."""

from providers.base import ProviderDisabled, ProviderSettings
from providers.local.cloud import LocalCloud
from providers.local.faults import FAULTS
from providers.local.metadata import MetadataServer
from providers.local.prices import SIMULATED, SpotWalk, local_offers
from providers.local.state import InstanceRecord, Interruption, StateDir

__all__ = [
    "FAULTS",
    "SIMULATED",
    "STATE_DIR",
    "InstanceRecord",
    "Interruption",
    "LocalCloud",
    "MetadataServer",
    "SpotWalk",
    "StateDir",
    "build",
    "local_offers",
]

STATE_DIR = "local-cloud"  # below the daemon's data directory


def build(settings: ProviderSettings) -> LocalCloud:
    """The daemon's embedded local cloud, its state in `<data dir>/local-cloud` (the
    registry's builder)."""
    if settings.data_dir is None:
        raise ProviderDisabled("the local cloud needs a data directory", provider="local")
    clock = settings.clock
    return LocalCloud(settings.data_dir / STATE_DIR, clock=lambda: clock().timestamp())
