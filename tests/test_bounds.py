"""Every duration and number a person writes has a finite upper bound: a policy, a job spec or
the daemon config with NaN, infinity, 2^64, a 4001-digit number or `99999999999h` is refused
with a located error naming the field and the bound, before anything can overflow a
`timedelta` or a `datetime` in the daemon (optimizer/common/bounds.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from optimizer.common.bounds import MAX_DURATION_S
from optimizer.daemon.config import ConfigError, load_config
from optimizer.jobs.spec import JobSpecError, parse_job_spec
from policies.loader import PolicyError, parse_policy
from policies.schema import Policy, parse_duration
from tests.helpers import FakeSource, api, make_config, policy_text, running, write_policy

HEAD = "apiVersion: gpuopt/v1\nkind: Policy\nname: p\n"
HUGE = "9" * 4001  # more digits than any float holds
TWO_64 = str(2**64)

# (the policy's line 4, the field it names, words of the message naming the bound)
POLICY_CASES = [
    ("migration: {min_stable: 99999999999h}", "migration.min_stable", "at most 87600h"),
    ("migration: {return_to_spot_after: .inf}", "migration.return_to_spot_after", "87600h"),
    ("migration: {min_runtime: .nan}", "migration.min_runtime", "must be a finite number"),
    ("utilization: {idle: {below: 0.1, for: 99999999999h}}", "utilization.idle.for", "87600h"),
    (f"utilization: {{low: {{below: 0.5, for: {HUGE}}}}}", "utilization.low.for", "87600h"),
    ("recovery: {pool_cooldown_minutes: 1.0e+15}", "recovery.pool_cooldown_minutes", "<= 5256000"),
    ("recovery: {on_demand_window_minutes: 1.0e+15}", "recovery.on_demand_window_minutes", "<="),
    ("recovery: {quota_cooldown_minutes: .inf}", "recovery.quota_cooldown_minutes", "finite"),
    ("recovery: {auth_cooldown_minutes: 5256001}", "recovery.auth_cooldown_minutes", "<= 5256000"),
    ("max_price_age_hours: 1.0e+300", "max_price_age_hours", "<= 87600"),
    ("max_duration: Infinity", "max_duration", "not a duration"),
    (f"max_duration: {HUGE}", "max_duration", "at most 87600h (10 years)"),
    (f"max_duration: {TWO_64}", "max_duration", "at most 87600h"),
    ("max_duration: 1.0e+300", "max_duration", "at most 87600h"),
    ("workload: {min_tflops: {bf16: .nan}}", "workload.min_tflops.bf16", "finite"),
    ("workload: {min_tflops: {bf16: 1.0e+300}}", "workload.min_tflops.bf16", "<= 1000000"),
    ("workload: {cpu_memory_gib: .inf}", "workload.cpu_memory_gib", "finite"),
    (f"workload: {{vcpus: {TWO_64}}}", "workload.vcpus", "<= 1000000"),
    ("budget: {monthly_usd: .inf}", "budget.monthly_usd", "finite"),
    ("budget: {monthly_usd: 1.0e+300}", "budget.monthly_usd", "<= 1000000000"),
    ("bid: {max_usd_per_hour: .nan}", "bid.max_usd_per_hour", "finite"),
    ("bid: {max_usd_per_gpu_hour: 1.0e+12}", "bid.max_usd_per_gpu_hour", "<= 1000000000"),
    ("bid: {max_fraction_of_on_demand: .nan}", "bid.max_fraction_of_on_demand", "finite"),
    (f"recovery: {{max_restarts: {TWO_64}}}", "recovery.max_restarts", "<= 1000000"),
    (f"recovery: {{on_demand_after_interruptions: {TWO_64}}}", "recovery.on_demand_", "<="),
    (f"migration: {{max_per_day: {TWO_64}}}", "migration.max_per_day", "<= 1000000"),
    (f"migration: {{disruption_budget: {TWO_64}}}", "migration.disruption_budget", "<="),
    ("buffer: .nan", "buffer", "finite"),
]


@pytest.mark.parametrize(("line", "field", "bound"), POLICY_CASES)
def test_a_policy_with_an_out_of_range_number_is_refused_naming_field_and_bound(
    line: str, field: str, bound: str
) -> None:
    with pytest.raises(PolicyError) as caught:
        parse_policy(HEAD + line + "\n", path="p.yaml")
    [problem] = caught.value.problems
    text = str(problem)
    assert text.startswith("p.yaml:4:"), text
    assert f": {field}" in text and bound in text, text


def test_the_longest_duration_and_the_largest_numbers_are_still_taken() -> None:
    policy = parse_policy(
        HEAD + "max_duration: 87600h\nmax_price_age_hours: 87600\n"
        "migration: {min_stable: 315360000}\nrecovery: {pool_cooldown_minutes: 5256000}\n"
        "budget: {monthly_usd: 1000000000}\n"
    )
    assert policy.max_duration == policy.migration.min_stable == MAX_DURATION_S
    assert policy.recovery.pool_cooldown_minutes == 5_256_000


@pytest.mark.parametrize(
    "value",
    ["99999999999h", 1e300, float("inf"), float("nan"), 2**64, 10**4000, -(10**4000)],
    ids=["hours", "1e300", "inf", "nan", "2^64", "4001-digits", "minus-4001-digits"],
)
def test_parse_duration_refuses_what_no_timedelta_holds(value: object) -> None:
    with pytest.raises(ValueError, match=r"at most 87600h|finite|negative"):
        parse_duration(value)


def test_the_policy_schema_says_the_bounds() -> None:
    schema = Policy.model_json_schema(by_alias=True)
    recovery = schema["$defs"]["Recovery"]["properties"]
    assert recovery["pool_cooldown_minutes"]["maximum"] == 5_256_000


SPEC = "name: j\npolicy: p\nrun: x\ncheckpoint_dir: /c\n"


@pytest.mark.parametrize(
    ("line", "field", "bound"),
    [
        ("max_duration: 1.0e+300", "max_duration", "at most 87600h (10 years)"),
        (f"max_duration: {HUGE}", "max_duration", "at most 87600h"),
        (f"max_duration: {TWO_64}", "max_duration", "at most 87600h"),
        ("max_duration: 99999999999h", "max_duration", "at most 87600h"),
        ("max_duration: .inf", "max_duration", "at most 87600h"),
        ("checkpoint_allowance_s: .nan", "checkpoint_allowance_s", "finite"),
        (f"max_restarts: {TWO_64}", "max_restarts", "<= 1000"),
        ("utilization: {idle: {below: 0.1, for: 1.0e+300}}", "utilization.idle.for", "87600h"),
    ],
)
def test_a_job_spec_with_an_out_of_range_number_is_refused_naming_field_and_bound(
    line: str, field: str, bound: str
) -> None:
    with pytest.raises(JobSpecError) as caught:
        parse_job_spec(SPEC + line + "\n", path="job.yaml")
    [problem] = caught.value.problems
    text = str(problem)
    assert text.startswith("job.yaml:5:") and f": {field}" in text and bound in text, text


@pytest.mark.parametrize(
    ("text", "field", "bound"),
    [
        ("loops: {reconcile_s: .inf}\n", "loops.reconcile_s", "finite"),
        ("loops: {watch_s: 1.0e+300}\n", "loops.watch_s", "<= 315360000"),
        ("providers: {local: {spot_interval_s: .nan}}\n", "providers.local.spot_interval_s", "fin"),
        ("prices: {retention: {hourly_days: 1.0e+300}}\n", "prices.retention.hourly_days", "3650"),
        (f"probes: {{demote_failed: {TWO_64}}}\n", "probes.demote_failed", "<= 1000000"),
        ("alerts: {retry: {max_age_hours: .inf}}\n", "alerts.retry.max_age_hours", "finite"),
        ("alerts: {retry: {max_s: 1.0e+300}}\n", "alerts.retry.max_s", "<= 315360000"),
    ],
)
def test_a_daemon_config_with_an_out_of_range_number_is_refused(
    tmp_path: Path, text: str, field: str, bound: str
) -> None:
    path = tmp_path / "gpuopt.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    [problem] = caught.value.problems
    said = str(problem)
    assert said.startswith(f"{path}:1:") and f": {field}" in said and bound in said, said


def test_a_non_finite_number_from_the_environment_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "gpuopt.yaml"
    path.write_text("api: {port: 9000}\n")
    monkeypatch.setenv("GPUOPT_LOOPS__RECONCILE_S", "inf")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    [problem] = caught.value.problems
    assert str(problem).startswith("GPUOPT_LOOPS__RECONCILE_S: loops.reconcile_s: must be a finite")


@pytest.mark.usefixtures("daemon_env")
def test_post_jobs_with_a_4001_digit_max_duration_is_a_422_naming_the_field(
    tmp_path: Path,
) -> None:
    write_policy(tmp_path / "policies", "small.yaml", policy_text("small", memory=16))
    job = {"name": "j", "policy": "small", "run": "x", "checkpoint_dir": "/c"}
    sent = {
        "digits": int(HUGE),
        "two_64": 2**64,
        "1e300": 1e300,
        "infinity": float("inf"),  # json.dumps writes the literal Infinity, which FastAPI reads
        "nan": float("nan"),
        "hours": "99999999999h",
    }
    config = make_config(tmp_path)
    with running(config, sources={"local": FakeSource([])}) as daemon, api(daemon) as client:
        answers = {
            why: client.post(
                "/jobs",
                content=json.dumps({**job, "max_duration": value}),
                headers={"Content-Type": "application/json"},
            )
            for why, value in sent.items()
        }
        listed = client.get("/jobs").json()["jobs"]
    for why, answer in answers.items():
        assert answer.status_code == 422, (why, answer.status_code, answer.text[:300])
        [error] = answer.json()["detail"]
        assert error["loc"][-1] == "max_duration", (why, error)
        assert "87600h" in error["msg"] or "finite" in error["msg"], (why, error)
    assert listed == []
