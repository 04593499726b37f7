"""Inline resources (policies/inline.py): written over a default policy, they override its keys
of the same meaning and leave the rest; a bad value is an error located at the field (the
file's line); the daemon's `policies.default` names the policy they are written over, and the
API keeps the effective policy with the job and answers it."""

from __future__ import annotations

from pathlib import Path

import pytest

from optimizer.jobs.spec import JobSpecError, parse_job_spec
from policies.inline import Resources, inline_name, merge, shipped_default
from policies.loader import parse_policy
from tests.helpers import api, make_config, running, wait_until, write_policy

pytestmark = pytest.mark.usefixtures("daemon_env")

BASE = """\
apiVersion: gpuopt/v1
kind: Policy
name: base
workload: {gpus: 2, gpu_models: [A100-80GB], gpu_memory_gib: 40}
markets: [on_demand]
bid: {max_fraction_of_on_demand: 0.6}
budget: {monthly_usd: 900}
recovery: {max_restarts: 7}
migration: {enabled: true}
"""


def test_inline_values_override_the_default_policy_and_the_rest_stays() -> None:
    base = parse_policy(BASE)
    resources = Resources(
        gpu="t4", gpus=1, market="spot", max_price=0.5, regions=["eu-*"], compliance="gdpr"
    )
    merged = merge(base, resources, name="job-train")
    assert merged.name == "job-train"
    assert merged.workload.gpu_models == ["T4"]  # the alias, canonical
    assert (merged.workload.gpus, merged.markets) == (1, ["spot"])
    assert merged.bid.max_usd_per_hour == 0.5
    assert merged.placement.regions.allow == ["eu-*"]
    assert merged.placement.compliance == "eu"
    # What the resources do not say stays the default policy's.
    assert merged.workload.gpu_memory_gib == 40
    assert merged.bid.max_fraction_of_on_demand == 0.6
    assert merged.budget.monthly_usd == 900
    assert merged.recovery.max_restarts == 7 and merged.migration.enabled
    # No resources: the default policy as it is, under the job's name.
    plain = merge(base, None, name="job-x")
    assert plain.model_copy(update={"name": "base", "description": ""}) == base


def test_the_shipped_default_and_the_job_policy_name() -> None:
    shipped = shipped_default()
    assert (shipped.name, shipped.markets, shipped.workload.gpus) == (
        "default",
        ["spot", "on_demand"],
        1,
    )
    assert inline_name("train") == "job-train"
    long = inline_name("a" * 63)
    assert len(long) <= 63 and long.startswith("job-aaaa") and long != inline_name("a" * 62)


def test_a_bad_inline_value_in_a_job_file_is_located_at_its_line() -> None:
    text = "name: train\nrun: echo hi\nresources:\n  gpu: T5\n  max_price: -1\n"
    with pytest.raises(JobSpecError) as caught:
        parse_job_spec(text, path="job.yaml")
    found = [str(p) for p in caught.value.problems]
    assert found[0].startswith("job.yaml:4:8: resources.gpu: unknown GPU model 'T5'")
    assert found[1].startswith("job.yaml:5:14: resources.max_price:")
    # Neither a policy nor a checkpoint is needed.
    spec = parse_job_spec("name: hi\nrun: echo hi\n")
    assert spec.inline and spec.restarts_from_beginning and spec.policy is None


def test_the_daemons_default_policy_is_written_over_and_kept_with_the_job(
    tmp_path: Path,
) -> None:
    write_policy(tmp_path / "policies", "base.yaml", BASE)
    config = make_config(tmp_path, policies={"default": "base"})
    job = {"name": "train", "run": "echo hi", "resources": {"gpu": "T4", "market": "spot"}}
    with running(config) as daemon, api(daemon) as client:
        wait_until(lambda: client.get("/policies/base").status_code == 200, what="the policy")
        plan = client.post("/jobs/plan", json=job).json()
        bad = client.post("/jobs/plan", json={**job, "resources": {"gpu": "T5"}})
        unknown = client.post("/jobs", json={**job, "policy": "nope"})
        submitted = client.post("/jobs", json=job)
        shown = client.get("/jobs/train").json()
        listed = client.get("/jobs").json()["jobs"]
        offers = client.get("/offers", params={"job": "train"})
    assert (plan["policy"], plan["base_policy"], plan["inline"]) == ("job-train", "base", True)
    doc = plan["effective_policy"]
    assert doc["workload"]["gpu_models"] == ["T4"] and doc["markets"] == ["spot"]
    assert doc["budget"]["monthly_usd"] == 900 and doc["recovery"]["max_restarts"] == 7
    assert plan["restarts_from_beginning"] is True
    assert plan["notes"] == [
        "no checkpoint or checkpoint_dir: after an interruption the job restarts from the "
        "beginning, and after a move too (the policy's migration is on)",
        "no offer meets the policy now: the job would wait, pending",  # no offers polled
    ]
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"][:3] == [
        "body",
        "resources",
        "gpu",
    ]
    assert unknown.status_code == 422
    assert unknown.json()["detail"][0]["loc"] == ["body", "policy"]
    assert submitted.status_code == 201, submitted.text
    answer = submitted.json()
    assert answer["policy"] == "job-train" and answer["effective_policy"] == doc
    assert "policy_document" not in answer["spec"]
    assert answer["spec"]["resources"] == {"gpu": "T4", "market": "spot"}
    assert shown["effective_policy"] == doc
    assert listed[0]["effective_policy"] is None  # lists stay small
    # The job's own policy is found by the readers that look a job's policy up.
    assert offers.status_code == 200 and offers.json()["policy"] == "job-train"


def test_a_default_that_is_not_loaded_is_refused_naming_the_setting(tmp_path: Path) -> None:
    config = make_config(tmp_path, policies={"default": "missing"})
    with running(config) as daemon, api(daemon) as client:
        refused = client.post("/jobs/plan", json={"name": "x", "run": "echo hi"})
    assert refused.status_code == 422
    [problem] = refused.json()["detail"]
    assert problem["loc"] == ["body", "policy"]
    assert problem["msg"].startswith("the daemon's policies.default names it, but no policy")


def test_policies_default_is_a_policy_name_in_the_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from optimizer.daemon.config import ConfigError, load_config

    path = tmp_path / "gpuopt.yaml"
    path.write_text("policies:\n  default: Bad_Name\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    [problem] = [str(p) for p in caught.value.problems]
    assert problem.startswith(f"{path}:2:12: policies.default: must be 1-63 lowercase")
    path.write_text("policies: {default: team}\n")
    assert load_config(path).policies.default == "team"
    monkeypatch.setenv("GPUOPT_POLICIES__DEFAULT", "other")
    assert load_config(path).policies.default == "other"
