"""The local cloud: offers from the bundled snapshot with simulated spot prices, instances as
local processes, a metadata endpoint shaped like AWS IMDSv2 and GCP's, injected interruptions
and launch failures. gpuopt's embedded default; see `providers/local/cloud.py`."""

from providers.local.cloud import LocalCloud
from providers.local.faults import FAULTS
from providers.local.metadata import MetadataServer
from providers.local.prices import SIMULATED, SpotWalk, local_offers
from providers.local.state import InstanceRecord, Interruption, StateDir

__all__ = [
    "FAULTS",
    "SIMULATED",
    "InstanceRecord",
    "Interruption",
    "LocalCloud",
    "MetadataServer",
    "SpotWalk",
    "StateDir",
    "local_offers",
]
