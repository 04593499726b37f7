"""The owned machines' inventory, checked where it is written, and how the provider judges a
machine's own report of its GPUs and carves offers out of free GPUs."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from optimizer.cli.tco_history import History, owned_usage
from policies import regions
from providers.ssh import SshConfig
from providers.ssh.inventory import Instance, MachineSpec, State
from providers.ssh.provider import UTILIZATION_S, instance_type, judge, shares, utilization

MACHINE: dict[str, Any] = {
    "name": "fra-gpu1",
    "host": "10.0.3.21",
    "user": "gpuopt",
    "region": "eu-central-1",
    "gpus": 4,
    "gpu_model": "A100-80GB",
    "tco": {"capex_usd": 90000},
}


def test_a_machine_in_frankfurt_is_placed_in_the_eu_by_its_region() -> None:
    spec = MachineSpec.model_validate(MACHINE)
    assert spec.zone == "eu-central-1"  # no site: the region
    place = regions.lookup("ssh", spec.region)
    assert place is not None and place.country == "DE"
    assert MachineSpec.model_validate({**MACHINE, "site": "fra-dc1"}).zone == "fra-dc1"


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"region": "frankfurt"}, "region", "unknown region 'frankfurt'"),
        ({"name": "GPU_1"}, "name", "lowercase letters"),
        ({"gpus": 0}, "gpus", "greater than or equal to 1"),
        ({"tco": {"capex": 1}}, "tco", "unknown TCO key 'capex'"),
        ({"tco": {"utilization": 1.5}}, "tco", "at most 1"),
        ({"colour": "red"}, "colour", "Extra inputs"),
    ],
)
def test_bad_machines_are_refused_naming_the_field(
    change: dict[str, Any], field: str, words: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        MachineSpec.model_validate({**MACHINE, **change})
    problem = caught.value.errors()[0]
    assert problem["loc"][0] == field
    assert words in problem["msg"]


def test_a_machine_listed_twice_is_refused() -> None:
    with pytest.raises(ValidationError, match="machine 'fra-gpu1' is listed twice"):
        SshConfig.model_validate({"machines": [MACHINE, MACHINE]})


def test_offers_carve_powers_of_two_and_the_whole_free_share() -> None:
    assert shares(1) == [1]
    assert shares(2) == [1, 2]
    assert shares(6) == [1, 2, 4, 6]
    assert shares(8) == [1, 2, 4, 8]
    assert instance_type(2, "T4") == "owned-2xT4"


def _gpus(*models: str) -> dict[str, Any]:
    return {
        "gpus": [{"index": i, "model": m, "memory_mib": 16384} for i, m in enumerate(models)],
        "simulated": False,
        "disk_free_gib": 812.4,
    }


def test_the_machine_report_is_judged_against_the_inventory() -> None:
    spec = MachineSpec.model_validate({**MACHINE, "gpus": 2, "gpu_model": "T4"})
    ok = judge(spec, _gpus("T4", "T4"), 0.0)
    assert ok.ok and ok.detail == "2x T4, 812 GiB free"
    fewer = judge(spec, _gpus("T4"), 0.0)
    assert not fewer.ok and fewer.detail == "the inventory says 2x T4, the machine has 1x T4"
    other = judge(spec, _gpus("A10G", "A10G"), 0.0)
    assert not other.ok and other.detail == "the inventory says 2x T4, the machine has 2x A10G"
    none = judge(spec, {"gpus": [], "simulated": False}, 0.0)
    assert not none.ok and none.detail == "no GPU found (NVML); simulate_gpus is off"


def test_measured_utilization_is_gpu_seconds_held_over_gpu_seconds_had() -> None:
    spec = MachineSpec.model_validate({**MACHINE, "gpus": 2, "gpu_model": "T4"})
    state = State(first_seen={"fra-gpu1": 1000.0})
    assert utilization(state, spec, 1000.0) is None  # not seen ready before now
    state.instances["a"] = Instance("a", "k1", "fra-gpu1", [0], "j", 1, "owned-1xT4", 0.1, 1000.0)
    state.instances["a"].ended_at = 1050.0  # 1 GPU for 50 s
    state.instances["b"] = Instance(
        "b", "k2", "fra-gpu1", [0, 1], "j", 2, "owned-2xT4", 0.2, 1080.0
    )
    state.instances["c"] = Instance("c", "k3", "other", [0], "j", 1, "owned-1xT4", 0.1, 1000.0)
    # 50 + 2 x 20 (b, still running at 1100) GPU-seconds of 2 x 100
    assert utilization(state, spec, 1100.0) == pytest.approx(90 / 200)
    # at most 30 days back: an old instance counts only inside the window
    later = 1000.0 + UTILIZATION_S + 100.0
    state.instances["b"].ended_at = 1100.0
    assert utilization(state, spec, later) == 0.0


def test_tco_from_history_reads_the_owned_machines_measured_utilization() -> None:
    out = History(hours_per_month=500.0)
    owned_usage(
        [
            {"name": "a", "gpus": 2, "utilization": 0.5},
            {"name": "b", "gpus": 6, "utilization": 0.9},
            {"name": "c", "gpus": 4, "utilization": None},  # not measured yet: left out
        ],
        out,
    )
    share = (0.5 * 2 + 0.9 * 6) / 8
    assert out.hours_per_month == pytest.approx(share * 730)
    assert "measured utilization (80.0% over 2 machine(s), 8 GPUs)" in out.notes[-1]
    untouched = History(hours_per_month=500.0)
    owned_usage([{"name": "c", "gpus": 4, "utilization": None}], untouched)
    assert untouched.hours_per_month == 500.0 and not untouched.notes
