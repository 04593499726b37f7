"""A policy, a job spec and an attempt with its own agent token (code API, standby)."""

from __future__ import annotations

from optimizer.daemon.service import Daemon
from optimizer.store.jobs import token_sha256
from tests.helpers import make_offer
from tests.helpers.offers import T0

POLICY = """\
apiVersion: gpuopt/v1
kind: Policy
name: p
workload: {gpus: 1}
placement: {providers: [local]}
"""


SPEC = {"name": "train", "run": "python main.py", "checkpoint_dir": "/ckpt"}


def attempt(daemon: Daemon, job: int, number: int) -> str:
    """An attempt of the job with its own agent token (returned)."""
    key, token = f"{job}-{number}", f"token-{job}-{number}"
    offer = make_offer(provider="aws", instance_type="p5.48xlarge")
    daemon.store.jobs.create_attempt(job, number, key, offer, token_sha256(token), T0)
    return token
