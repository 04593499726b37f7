"""Each cloud's billing rules for instances and their root volumes (facts, with sources).

Sources (see docs/costs.md for the full citations):
- AWS EC2: per-second billing with a 60-second minimum for Linux On-Demand, Reserved and
  Spot instances, each transition to `running` starting a new minimum
  (repost.aws/knowledge-center/ec2-instance-hour-billing; the EC2 user guide's instance
  lifecycle page). A Spot Instance that Amazon EC2 interrupts within its first hour is not
  charged; one you stop or terminate yourself is charged for the seconds used (the EC2 user
  guide, "Billing for interrupted Spot Instances").
- GCP Compute Engine: per-second billing with a 1-minute minimum for vCPUs, memory and GPUs
  (Google's 2017 announcement, quoted secondhand); a Spot VM preempted within its first
  minute is not charged (the Spot VMs page, quoted secondhand). No first-hour credit.
- Root volumes: AWS gp3 $0.08 per GB-month in us-east-1, per second with a 60 s minimum,
  charge = price x GB x seconds / (86,400 x days in the month) (EBS pricing page, quoted
  secondhand); GCP pd-balanced $0.10 per GB-month in us-central1, prorated by the second
  (the Cloud Billing Catalog as compiled in a public pricing table, 2025-03-06). Both are
  the list price of one region, used for every region until the adapters read storage SKUs.
- The local cloud bills as AWS does, so its numbers exercise the same rules.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BillingRule:
    """How one provider bills an instance and its root volume."""

    minimum_s: float
    # A spot instance the cloud itself interrupts within this many seconds of its launch is
    # not charged at all (None: no such credit).
    interrupted_free_s: float | None
    disk_usd_per_gib_month: float
    disk_type: str


AWS = BillingRule(
    minimum_s=60.0, interrupted_free_s=3600.0, disk_usd_per_gib_month=0.08, disk_type="gp3"
)
GCP = BillingRule(
    minimum_s=60.0, interrupted_free_s=60.0, disk_usd_per_gib_month=0.10, disk_type="pd-balanced"
)

RULES: dict[str, BillingRule] = {"aws": AWS, "gcp": GCP, "local": AWS}


def rule_for(provider: str) -> BillingRule:
    """The provider's rule; an unknown provider bills as AWS does (per second, 60 s minimum)."""
    return RULES.get(provider, AWS)
