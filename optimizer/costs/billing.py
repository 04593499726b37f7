"""Each provider's billing rule for its instances and their root volumes.

The rules are facts each provider declares in its registry entry (`ProviderEntry.billing`,
with their sources in the provider's package: providers/aws, providers/gcp; the local cloud
bills as AWS does, so its numbers exercise the same rules). A provider no installed package
declares is a RegistryError naming the installed ones: its charges are never priced by
another cloud's rule.
"""

from __future__ import annotations

from providers.facts import BillingRule

__all__ = ["BillingRule", "rule_for"]


def rule_for(provider: str) -> BillingRule:
    """The provider's rule, from its registry entry (imported here, when a cost is priced:
    the registry loads every provider's settings model, and `gpuopt costs`, which only
    shows the daemon's figures, imports this package at the CLI's start)."""
    from providers import registry

    return registry.get(provider).billing_rule()
