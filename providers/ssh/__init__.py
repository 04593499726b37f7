"""Owned GPU machines reached over SSH: offers priced by their TCO (market `owned`), jobs
started there by the same agent bootstrap as on the clouds, and machines taken back through
the same hot handover as a spot reclaim. See docs/owned.md and providers/ssh/provider.py.

paramiko is imported only by the transport, which only a daemon with owned machines loads."""

from __future__ import annotations

from optimizer import hardware
from providers.base import ProviderDisabled, ProviderSettings
from providers.facts import OWNED_BILLING, FocusNames
from providers.registry import Capabilities, ProviderEntry
from providers.ssh.inventory import MachineSpec, SshConfig
from providers.ssh.provider import NAME, MachineError, SshProvider

STATE_DIR = "ssh"  # below the daemon's data directory

# An owned machine is paid for whether it runs or not; what an attempt is billed is its share
# of that cost (the TCO rate of its GPUs) for the seconds it held them: no minimum, no spot
# credit, and no volume charge (the disk is part of the machine's capex).
BILLING = OWNED_BILLING


def machine_rate(machine: MachineSpec) -> float:
    """The machine's price per GPU-hour from its TCO (`gpuopt tco`'s formulas and defaults,
    with the machine's `tco` overrides); ValueError when a figure is missing (a GPU model
    with no known server price and no `capex_usd`)."""
    from optimizer.costs.owned import owned_cost, usd_per_gpu_hour
    from optimizer.costs.tco_assumptions import Assumptions

    cost = owned_cost(machine.gpus, machine.gpu_model, machine.tco, Assumptions())
    return usd_per_gpu_hour(cost)


def build(settings: ProviderSettings) -> SshProvider:
    """The owned machines of the daemon's `providers.ssh` section (the registry's builder)."""
    if settings.data_dir is None:
        raise ProviderDisabled("owned machines need the daemon's data directory", provider=NAME)
    config = settings.config
    if not isinstance(config, SshConfig):
        config = SshConfig.model_validate(config.model_dump())
    clock = settings.clock
    return SshProvider(
        config,
        settings.data_dir / STATE_DIR,
        rate=machine_rate,
        clock=lambda: clock().timestamp(),
    )


ENTRY = ProviderEntry(
    NAME,
    Capabilities(
        launch=True,
        live_offers=True,
        watcher="owned-file",
        markets=("owned",),
        offers_follow_launches=True,
    ),
    build,
    billing=BILLING,
    hardware=hardware.LOCAL_FACTS,
    settings=SshConfig,
    focus=FocusNames("Owned machines (gpuopt)", "Owned GPU machines", "Owned disks"),
)

__all__ = ["BILLING", "ENTRY", "MachineError", "MachineSpec", "SshConfig", "SshProvider", "build"]
