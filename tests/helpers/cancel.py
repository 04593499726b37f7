"""Shared by the tests: moved from tests/test_jobs_cancel.py, which uses them too."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from optimizer.model import Offer
from policies.schema import Policy
from providers.base import InstanceRef, InstanceState, InstanceStatus, LaunchSpec

NOW = datetime(2026, 11, 30, 12, tzinfo=UTC)


@dataclass
class FakeCloud:
    """Launches succeed; instances run until terminated."""

    running: set[str] = field(default_factory=set)
    launched: list[str] = field(default_factory=list)
    terminated: list[str] = field(default_factory=list)

    def fetch_offers(self, regions: Any = None) -> list[Offer]:
        return []

    def launch(self, offer: Offer, spec: LaunchSpec, key: str) -> InstanceRef:
        instance = f"i-{key}"
        if instance not in self.launched:
            self.launched.append(instance)
            self.running.add(instance)
        return InstanceRef(offer.provider, offer.region, offer.zone, instance)

    def describe(self, refs: Sequence[InstanceRef]) -> list[InstanceStatus]:
        return [
            InstanceStatus(
                ref,
                InstanceState.RUNNING
                if ref.instance_id in self.running
                else InstanceState.TERMINATED,
            )
            for ref in refs
        ]

    def terminate(self, ref: InstanceRef) -> None:
        self.running.discard(ref.instance_id)
        self.terminated.append(ref.instance_id)


@dataclass(frozen=True)
class InForce:
    policy: Policy
