"""Names gpuopt derives for GCP: instance types, instance names, labels, request ids."""

from __future__ import annotations

import re
import uuid

import pytest

from providers.gcp.names import (
    InstanceType,
    attached_instance_type,
    instance_name,
    label_key,
    label_value,
    parse_instance_type,
    region_of,
    request_id,
)

NAME_RULE = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")  # Compute API Instance.name
LABEL_RULE = re.compile(r"^[a-z0-9_-]{0,63}$")


def test_attached_instance_types_round_trip() -> None:
    kind = attached_instance_type("n1-standard-8", "nvidia-tesla-t4", 2)
    assert kind == "n1-standard-8+nvidia-tesla-t4:2"
    assert parse_instance_type(kind) == InstanceType("n1-standard-8", "nvidia-tesla-t4", 2)
    assert parse_instance_type("a2-highgpu-8g") == InstanceType("a2-highgpu-8g")
    with pytest.raises(ValueError):
        parse_instance_type("n1-standard-8+nvidia-tesla-t4")


def test_region_of_a_zone() -> None:
    assert region_of("europe-west4-a") == "europe-west4"
    assert region_of("us-central1-f") == "us-central1"


@pytest.mark.parametrize("job", ["train", "Fine-Tune LLaMA 3 (70B) / run#12", "x" * 200, "--"])
def test_instance_names_are_valid_and_stable(job: str) -> None:
    name = instance_name(job, 12, f"{job}:12")
    assert NAME_RULE.match(name) and len(name) <= 63
    assert name == instance_name(job, 12, f"{job}:12")
    assert name != instance_name(job, 12, f"{job}:12b")


@pytest.mark.parametrize("text", ["Team A", "ML/Ops", "a" * 100, "ÄÖÜ-résumé"])
def test_label_values_and_keys_follow_the_label_rules(text: str) -> None:
    assert LABEL_RULE.match(label_value(text))
    key = label_key(text)
    assert LABEL_RULE.match(key) and key[0].isalpha()
    assert label_value("a" * 100) != label_value("a" * 99 + "b")  # long values stay distinct
    assert label_key("9lives").startswith("k-")


def test_request_ids_are_stable_uuid5_per_key_and_action() -> None:
    first = request_id("job-1:1")
    assert uuid.UUID(first).version == 5 and uuid.UUID(first).int != 0
    assert first == request_id("job-1:1")
    assert first != request_id("job-1:2")
    assert first != request_id("job-1:1", "delete")
