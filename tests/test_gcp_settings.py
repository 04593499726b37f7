"""GCP configuration: project, credentials check, endpoint overrides and emulator mode."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from providers.base import ProviderDisabled
from providers.gcp import GcpProvider, GcpSettings, gcp_disabled_reason, make_gcp_provider
from providers.gcp import settings as gcp_settings
from providers.gcp.settings import EndpointError, endpoint_is_emulator

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).parent / "data" / "gcp"
AUTHORIZED_USER = {
    "type": "authorized_user",
    "client_id": "764086051850-example.apps.googleusercontent.com",
    "client_secret": "not-a-secret",
    "refresh_token": "1//not-a-token",
}
GCP_ENV = (
    "GPUOPT_GCP_PROJECT",
    "GPUOPT_GCP_REGIONS",
    "GPUOPT_GCP_COMPUTE_ENDPOINT",
    "GPUOPT_GCP_BILLING_ENDPOINT",
    "GPUOPT_GCP_BILLING_API_KEY",
    "GOOGLE_APPLICATION_CREDENTIALS",
)


@pytest.fixture(autouse=True)
def no_ambient_credentials(monkeypatch, tmp_path) -> Iterator[Path]:
    """No GCP variables, an empty gcloud folder, and not on a GCE VM."""
    for name in GCP_ENV:
        monkeypatch.delenv(name, raising=False)
    gcloud = tmp_path / "gcloud"
    gcloud.mkdir()
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(gcloud))
    monkeypatch.setattr(gcp_settings, "GCE_PRODUCT_NAME_FILE", tmp_path / "no-dmi")
    yield gcloud


def test_without_a_project_gcp_is_disabled_with_one_line() -> None:
    reason = gcp_disabled_reason()
    assert reason == "no GCP project: set GPUOPT_GCP_PROJECT"


def test_without_credentials_gcp_is_disabled_with_one_line() -> None:
    reason = gcp_disabled_reason("my-project")
    assert reason is not None and "\n" not in reason
    assert (
        "Application Default Credentials" in reason and "gcloud auth application-default" in reason
    )


def test_a_credentials_file_named_by_the_environment_enables_gcp(monkeypatch, tmp_path) -> None:
    path = tmp_path / "adc.json"
    path.write_text(json.dumps(AUTHORIZED_USER))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(path))
    monkeypatch.setenv("GPUOPT_GCP_PROJECT", "my-project")
    assert gcp_disabled_reason() is None


def test_gclouds_application_default_file_enables_gcp(no_ambient_credentials) -> None:
    (no_ambient_credentials / "application_default_credentials.json").write_text(
        json.dumps(AUTHORIZED_USER)
    )
    assert gcp_disabled_reason("my-project") is None


def test_a_workload_identity_file_is_checked_without_the_network(monkeypatch, tmp_path) -> None:
    token = tmp_path / "token"
    token.write_text("header.payload.signature")
    config = {
        "type": "external_account",
        "audience": (
            "//iam.googleapis.com/projects/1/locations/global/workloadIdentityPools/p/providers/x"
        ),
        "subject_token_type": "urn:ietf:params:oauth:token-type:jwt",
        "token_url": "https://sts.googleapis.com/v1/token",
        "credential_source": {"file": str(token)},
    }
    path = tmp_path / "wif.json"
    path.write_text(json.dumps(config))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(path))
    monkeypatch.delenv("GOOGLE_CLOUD_PROJECT", raising=False)
    assert gcp_disabled_reason("my-project") is None


def test_a_broken_credentials_file_is_named_in_the_reason(monkeypatch, tmp_path) -> None:
    path = tmp_path / "adc.json"
    path.write_text('{"type": "nonsense"}')
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(path))
    reason = gcp_disabled_reason("my-project")
    assert reason is not None and "unusable" in reason and str(path) in reason


def test_on_a_gce_vm_the_attached_service_account_counts(monkeypatch, tmp_path) -> None:
    dmi = tmp_path / "product_name"
    dmi.write_text("Google Compute Engine\n")
    monkeypatch.setattr(gcp_settings, "GCE_PRODUCT_NAME_FILE", dmi)
    assert gcp_disabled_reason("my-project") is None


def test_local_emulators_need_no_credentials() -> None:
    local = GcpSettings(
        project="p",
        compute_endpoint="http://127.0.0.1:8089",
        billing_endpoint="http://localhost:8089",
    )
    assert gcp_disabled_reason(settings=local) is None
    remote_billing = GcpSettings(project="p", compute_endpoint="http://127.0.0.1:8089")
    assert gcp_disabled_reason(settings=remote_billing) is not None  # billing still needs ADC
    with_key = GcpSettings(project="p", compute_endpoint="http://[::1]:8089", billing_api_key="k")
    assert gcp_disabled_reason(settings=with_key) is None


@pytest.mark.parametrize(
    ("url", "emulated"),
    [
        (None, False),
        ("https://compute-psc.p.googleapis.com", False),
        ("compute-psc.p.googleapis.com:443", False),
        ("http://127.0.0.1:8089", True),
        ("http://localhost", True),
        ("http://[::1]:9000", True),
    ],
)
def test_endpoint_modes(url, emulated) -> None:
    assert endpoint_is_emulator(url) is emulated


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://10.0.0.5:8080", "loopback"),
        ("http://compute.internal.example", "loopback"),
        ("ftp://127.0.0.1", "not an http(s) endpoint"),
        ("https://compute.example/compute/v1", "not a path"),
    ],
)
def test_unsafe_or_malformed_endpoints_are_refused(url, why) -> None:
    with pytest.raises(EndpointError, match=re.escape(why)):
        endpoint_is_emulator(url, "GPUOPT_GCP_COMPUTE_ENDPOINT")
    reason = gcp_disabled_reason(settings=GcpSettings(project="p", compute_endpoint=url))
    assert reason is not None and why in reason


def test_settings_come_from_the_environment_and_overrides_win(monkeypatch) -> None:
    monkeypatch.setenv("GPUOPT_GCP_PROJECT", "env-project")
    monkeypatch.setenv("GPUOPT_GCP_REGIONS", "europe-west4, us-central1,")
    monkeypatch.setenv("GPUOPT_GCP_BILLING_API_KEY", "  ")
    settings = GcpSettings.from_env(project="config-project", compute_endpoint=None)
    assert settings.project == "config-project"
    assert settings.regions == ("europe-west4", "us-central1")
    assert settings.billing_api_key is None


def test_make_gcp_provider_refuses_with_the_reason() -> None:
    with pytest.raises(ProviderDisabled, match="no GCP project"):
        make_gcp_provider()
    with pytest.raises(ProviderDisabled, match="no GCP project"):
        GcpProvider("")
    with pytest.raises(ProviderDisabled, match="loopback"):
        GcpProvider("p", client_options={"api_endpoint": "http://192.0.2.7:80"})


def test_the_environment_points_a_plain_provider_at_a_local_emulator(monkeypatch) -> None:
    pytest.importorskip("google.cloud.compute_v1")
    from tests.helpers.gcp_fake import FakeGcp

    with FakeGcp.from_recorded(DATA) as fake:
        monkeypatch.setenv("GPUOPT_GCP_PROJECT", "gpuopt-test")
        monkeypatch.setenv("GPUOPT_GCP_COMPUTE_ENDPOINT", fake.url)
        monkeypatch.setenv("GPUOPT_GCP_BILLING_ENDPOINT", fake.url)
        assert gcp_disabled_reason() is None
        offers = make_gcp_provider().fetch_offers(["europe-west4"])
        assert offers and {o.region for o in offers} == {"europe-west4"}
        # What optimizer/cli/sources.py does: GcpProvider(project) alone honours the overrides.
        assert GcpProvider("gpuopt-test").fetch_offers(["us-central1"])
        assert fake.calls("GET", "/v1/services/6F81-5844-456A/skus")


def test_a_billing_api_key_replaces_credentials_for_the_catalog_client() -> None:
    pytest.importorskip("google.cloud.billing_v1")
    from providers.gcp.clients import Clients

    clients = Clients(
        billing_options={"api_endpoint": "cloudbilling.googleapis.com", "api_key": "k"}
    )
    credentials = clients.catalog.transport._credentials
    assert type(credentials).__module__ == "google.auth.api_key"


def test_importing_the_gcp_package_loads_no_google_sdk() -> None:
    code = (
        "import sys, providers, providers.gcp\n"
        "from providers.gcp import gcp_disabled_reason\n"
        "gcp_disabled_reason()\n"
        "heavy = [m for m in sys.modules if m.startswith(('google.cloud', 'google.api_core'))]\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == ""
