"""Helpers shared by the tests (and the benches that drive a daemon): import them from here.

- waiting: `wait_until`, the one way to wait for a condition (with a deadline).
- offers: `make_offer`, the one offer factory; `FakeSource`, an offer source a test steers;
  `steady_clock`, the clock of daemons serving offers observed at `T0`.
- policies: `policy_text`, `write_policy`.
- daemon: the in-process daemon (`make_config`, `running`, `api`) and `gpuopt` as a real
  process (`start_gpuopt`, `run_gpuopt`, `DaemonProcess`).
- cloud: `local_cloud`, a started local cloud that powers its instances off afterwards.

Narrower ones import from their modules: `tests.helpers.agent` (a fake daemon for the agent),
`tests.helpers.aws` (Stubber sessions, Price List rows), `tests.helpers.jobs` (jobs end to end
on the local cloud, on a SteadyClock from MID_MONTH), `tests.helpers.gotemplate_lint`. Fixtures
are in tests/conftest.py, but for those of the end-to-end modules, which bind them under their
own names (`clock, cloud, daemon = E2E_FIXTURES`; `cloud, daemon = AGENT_FIXTURES`).
"""

from tests.helpers.cloud import local_cloud
from tests.helpers.daemon import (
    GPUOPT,
    TOKEN,
    DaemonProcess,
    api,
    gpuopt_env,
    make_config,
    run_gpuopt,
    running,
    start_gpuopt,
)
from tests.helpers.offers import T0, FakeSource, make_offer, steady_clock
from tests.helpers.policies import policy_text, write_policy
from tests.helpers.waiting import wait_until

__all__ = [
    "GPUOPT",
    "T0",
    "TOKEN",
    "DaemonProcess",
    "FakeSource",
    "api",
    "gpuopt_env",
    "local_cloud",
    "make_config",
    "make_offer",
    "policy_text",
    "run_gpuopt",
    "running",
    "start_gpuopt",
    "steady_clock",
    "wait_until",
    "write_policy",
]
