"""Deleting a gang's placement once the gang is over.

A multi-node attempt's nodes launch into one placement that the provider makes for the gang
with its first node (`LaunchSpec.gang`: an AWS cluster placement group, a GCP compact
resource policy; `gang.placement_name`). Nothing else deletes it, so each reconcile pass
asks the provider to, for every gang on a provider that declares `gang_placement`
(providers/registry.py) whose placement is not yet known deleted, once every node's row has
ended and its instance is gone (the provider's describe said so) or never existed. The cloud
refuses while an instance is still in the placement: the gang is asked about again next
pass. A placement already gone counts as deleted, so asking twice (a restart, another
leader) is harmless; once deleted, every row of the gang records when
(`attempt.placement_released_at`) and the gang is not asked about again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from optimizer.jobs.context import ReconcileContext
from optimizer.jobs.gang import placement_name
from optimizer.store.jobs import AttemptRecord
from providers import registry
from providers.base import Provider, ProviderError

log = logging.getLogger(__name__)

ProviderOf = Callable[[ReconcileContext, str], Provider | None]


def over(rows: list[AttemptRecord]) -> bool:
    """Whether nothing of the gang can still run in its placement: every node's row ended,
    and each node's instance is gone or was never launched."""
    return all(a.ended and (a.instance_id is None or a.instance_gone) for a in rows)


def release_placements(ctx: ReconcileContext, provider_of: ProviderOf) -> list[str]:
    """Delete the placements of the gangs that are over (module docstring); the names
    deleted (or found gone) this pass."""
    owners = [
        name
        for name in ctx.providers
        if (entry := registry.find(name)) is not None and entry.capabilities.gang_placement
    ]
    released: list[str] = []
    for rows in ctx.store.jobs.unreleased_gangs(owners):
        if not over(rows) or not ctx.leading():
            continue
        head = rows[0]
        source = provider_of(ctx, head.provider)
        owner = registry.get(head.provider).placement_owner(source) if source else None
        if owner is None:
            continue  # not reachable now: asked again once it is
        name = placement_name(head.job_id, head.gang or head.number)
        try:
            gone = owner.release_placement(head.region, name)
        except ProviderError as exc:
            log.warning("deleting placement %s in %s failed: %s", name, head.region, exc)
            continue
        if not gone:
            log.info("placement %s in %s is still in use; asking again", name, head.region)
            continue
        ctx.store.jobs.mark_placement_released(head.job_id, head.gang or head.number, ctx.now)
        log.info("deleted placement %s in %s (%s)", name, head.region, head.provider)
        released.append(name)
    return released
