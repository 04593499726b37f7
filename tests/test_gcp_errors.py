"""GCP error codes become typed provider errors (pure classification; one test per code)."""

from __future__ import annotations

import pytest

from providers.base import AuthError, CapacityError, ProviderError, QuotaError, ThrottledError
from providers.gcp.errors import (
    ErrorFacts,
    classify,
    exception_facts,
    is_already_exists,
    operation_facts,
)

ZONE = "us-central1-a"
STOCKOUT = (
    "The zone 'projects/p/zones/us-central1-a' does not have enough resources available to "
    "fulfill the request.  Try a different zone, or try again later."
)


def test_zone_resource_pool_exhausted_is_a_capacity_error_in_that_zone() -> None:
    facts = operation_facts([{"code": "ZONE_RESOURCE_POOL_EXHAUSTED", "message": STOCKOUT}])
    error = classify(facts, zone=ZONE)
    assert type(error) is CapacityError
    assert (error.zone, error.code, error.provider) == (ZONE, "ZONE_RESOURCE_POOL_EXHAUSTED", "gcp")


def test_zone_resource_pool_exhausted_with_details_is_a_capacity_error() -> None:
    entry = {
        "code": "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
        "message": STOCKOUT,
        "errorDetails": [
            {
                "errorInfo": {
                    "reason": "resource_availability",
                    "domain": "compute.googleapis.com",
                    "metadatas": {
                        "zone": ZONE,
                        "vmType": "n1-standard-8",
                        "attachment": "nvidia-tesla-t4:1",
                    },
                }
            }
        ],
    }
    error = classify(operation_facts([entry]), zone=ZONE)
    assert type(error) is CapacityError and error.zone == ZONE


def test_quota_exceeded_names_the_quota_metric() -> None:
    entry = {
        "code": "QUOTA_EXCEEDED",
        "message": (
            "Quota 'PREEMPTIBLE_NVIDIA_T4_GPUS' exceeded.  Limit: 0.0 in region us-central1."
        ),
    }
    error = classify(operation_facts([entry]), zone=ZONE)
    assert type(error) is QuotaError
    assert "PREEMPTIBLE_NVIDIA_T4_GPUS" in str(error)


def test_quota_metric_is_read_from_quota_info_when_the_message_lacks_it() -> None:
    entry = {
        "code": "QUOTA_EXCEEDED",
        "message": "Quota exceeded for this request.",
        "errorDetails": [{"quotaInfo": {"metricName": "compute.googleapis.com/gpus_all_regions"}}],
    }
    error = classify(operation_facts([entry]))
    assert type(error) is QuotaError and "compute.googleapis.com/gpus_all_regions" in str(error)


def test_rate_limit_exceeded_is_throttling_even_on_http_403() -> None:
    error = classify(ErrorFacts(("rateLimitExceeded",), 403, "Rate Limit Exceeded"))
    assert type(error) is ThrottledError


def test_http_429_is_throttling() -> None:
    error = classify(ErrorFacts((), 429, "Too many requests"))
    assert type(error) is ThrottledError and error.code == "429"


def test_resource_operation_rate_exceeded_is_throttling() -> None:
    facts = operation_facts([{"code": "RESOURCE_OPERATION_RATE_EXCEEDED", "message": "slow down"}])
    assert type(classify(facts, zone=ZONE)) is ThrottledError


@pytest.mark.parametrize("status", [401, 403])
def test_unauthenticated_and_forbidden_are_auth_errors(status: int) -> None:
    error = classify(ErrorFacts(("forbidden",), status, "Required 'compute.instances.create'"))
    assert type(error) is AuthError


def test_quota_reason_on_http_403_is_a_quota_error_not_auth() -> None:
    facts = ErrorFacts(
        ("QUOTA_EXCEEDED",), 403, "Quota 'GPUS_ALL_REGIONS' exceeded.  Limit: 0.0 globally."
    )
    error = classify(facts)
    assert type(error) is QuotaError and "GPUS_ALL_REGIONS" in str(error)


def test_anything_else_is_a_plain_provider_error() -> None:
    error = classify(
        ErrorFacts(("invalid",), 400, "Invalid value for field 'resource.machineType'")
    )
    assert type(error) is ProviderError and error.code == "invalid"


def test_the_real_cause_behind_vm_min_count_not_reached_decides() -> None:
    facts = operation_facts(
        [
            {"code": "VM_MIN_COUNT_NOT_REACHED", "message": "Requested minCount of 1 is not met."},
            {"code": "ZONE_RESOURCE_POOL_EXHAUSTED", "message": STOCKOUT},
        ]
    )
    assert type(classify(facts, zone=ZONE)) is CapacityError


def test_already_exists_is_recognised_by_status_or_code() -> None:
    assert is_already_exists(ErrorFacts(("alreadyExists",), 409, "exists"))
    assert is_already_exists(operation_facts([{"code": "RESOURCE_ALREADY_EXISTS"}]))
    assert not is_already_exists(ErrorFacts(("notFound",), 404, "gone"))


def test_facts_from_a_google_api_core_exception() -> None:
    core = pytest.importorskip("google.api_core.exceptions")
    exc = core.Forbidden(
        "Rate Limit Exceeded",
        errors=[{"domain": "usageLimits", "reason": "rateLimitExceeded", "message": "Rate"}],
    )
    facts = exception_facts(exc)
    assert facts is not None and facts.status == 403 and "rateLimitExceeded" in facts.codes
    assert exception_facts(ValueError("not a cloud error")) is None
