"""GCP configuration: project, regions, endpoint overrides, and whether GCP can run here.

Read from the environment (or passed in by whoever reads a config file). Nothing here calls
a Google API; the credential check reads local files only.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

PROJECT_ENV = "GPUOPT_GCP_PROJECT"
REGIONS_ENV = "GPUOPT_GCP_REGIONS"  # comma-separated
COMPUTE_ENDPOINT_ENV = "GPUOPT_GCP_COMPUTE_ENDPOINT"
BILLING_ENDPOINT_ENV = "GPUOPT_GCP_BILLING_ENDPOINT"
BILLING_API_KEY_ENV = "GPUOPT_GCP_BILLING_API_KEY"
CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
# Where `gcloud auth application-default login` writes ADC (REFERENCE §2.7); CLOUDSDK_CONFIG
# moves the gcloud configuration folder.
_GCLOUD_ADC_FILE = "application_default_credentials.json"
# GCE VMs say "Google" here; google-auth reads the same file to detect GCE without a network
# call (`google.auth.compute_engine._metadata.detect_gce_residency_linux`).
GCE_PRODUCT_NAME_FILE = Path("/sys/class/dmi/id/product_name")
_LOOPBACK_NAMES = frozenset({"localhost"})


class EndpointError(ValueError):
    """An endpoint override gpuopt refuses to use; the message says why in one line."""


def _env(environ: Mapping[str, str], name: str) -> str | None:
    value = environ.get(name, "").strip()
    return value or None


@dataclass(frozen=True, slots=True)
class GcpSettings:
    """Where and as whom gpuopt talks to GCP. None everywhere means Google's defaults."""

    project: str | None = None
    regions: tuple[str, ...] | None = None
    compute_endpoint: str | None = None
    billing_endpoint: str | None = None
    billing_api_key: str | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> GcpSettings:
        """`GPUOPT_GCP_*` variables; keyword overrides (e.g. from a config file) win."""
        env = os.environ if environ is None else environ
        raw_regions = _env(env, REGIONS_ENV)
        regions = (
            tuple(r.strip() for r in raw_regions.split(",") if r.strip()) if raw_regions else None
        )
        settings = cls(
            project=_env(env, PROJECT_ENV),
            regions=regions or None,
            compute_endpoint=_env(env, COMPUTE_ENDPOINT_ENV),
            billing_endpoint=_env(env, BILLING_ENDPOINT_ENV),
            billing_api_key=_env(env, BILLING_API_KEY_ENV),
        )
        given = {k: v for k, v in overrides.items() if v is not None}
        return replace(settings, **given) if given else settings

    @property
    def compute_emulated(self) -> bool:
        return endpoint_is_emulator(self.compute_endpoint, COMPUTE_ENDPOINT_ENV)

    @property
    def billing_emulated(self) -> bool:
        return endpoint_is_emulator(self.billing_endpoint, BILLING_ENDPOINT_ENV)

    def needs_adc(self) -> bool:
        """False when every API is a local emulator or billing is reached with an API key."""
        billing_ok = self.billing_emulated or self.billing_api_key is not None
        return not (self.compute_emulated and billing_ok)


def _is_loopback(host: str) -> bool:
    if host.lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def endpoint_is_emulator(url: str | None, origin: str = "endpoint") -> bool:
    """True for an `http://` loopback endpoint (emulator mode, anonymous credentials).

    Raises EndpointError for `http://` to any other host: credentials would cross the network
    in clear text. `https://host[:port]` and a bare `host[:port]` (HTTPS) are accepted.
    """
    if not url:
        return False
    parts = urlsplit(url if "://" in url else f"https://{url}")
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        raise EndpointError(f"{origin}: {url!r} is not an http(s) endpoint")
    if parts.path not in {"", "/"}:
        raise EndpointError(f"{origin}: give the host (and port) only, not a path: {url!r}")
    if parts.scheme == "https":
        return False
    if not _is_loopback(parts.hostname):
        raise EndpointError(
            f"{origin}: http:// is allowed only for loopback addresses (127.0.0.1, ::1, "
            f"localhost); use https:// for {parts.hostname}"
        )
    return True


def _adc_file(environ: Mapping[str, str]) -> Path | None:
    explicit = _env(environ, "GOOGLE_APPLICATION_CREDENTIALS")
    if explicit:
        return Path(explicit)
    config = _env(environ, "CLOUDSDK_CONFIG")
    folder = Path(config) if config else Path.home() / ".config" / "gcloud"
    candidate = folder / _GCLOUD_ADC_FILE
    return candidate if candidate.is_file() else None


def _on_gce() -> bool:
    try:
        return GCE_PRODUCT_NAME_FILE.read_text(encoding="utf-8").strip().startswith("Google")
    except OSError:
        return False


def adc_problem() -> str | None:
    """Why Application Default Credentials are unusable here, or None when they are found.

    Reads the credentials file (`GOOGLE_APPLICATION_CREDENTIALS`, else gcloud's) through
    `google.auth.default()`; on a GCE VM the attached service account counts. No network.
    """
    try:
        import google.auth
        from google.auth.exceptions import DefaultCredentialsError, TransportError
    except ImportError:
        return "google-auth is not installed (pip install google-cloud-compute)"
    path = _adc_file(os.environ)
    if path is None:
        if _on_gce():
            return None  # the VM's service account, through the metadata server
        return (
            "no Application Default Credentials: run `gcloud auth application-default login` "
            "or set GOOGLE_APPLICATION_CREDENTIALS"
        )

    from google.auth.transport import Request

    class Offline(Request):
        """default() may look a project up over the network (workload identity files)."""

        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            raise TransportError("gpuopt checks credentials offline")

    try:
        # Only a file source is left to find, so default() resolves it from the file.
        google.auth.default(scopes=[CLOUD_PLATFORM_SCOPE], request=Offline())
    except DefaultCredentialsError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return f"Application Default Credentials unusable ({path}): {first}"
    except TransportError:
        return None  # the file loaded; only its project lookup wanted the network
    return None


def gcp_disabled_reason(
    project: str | None = None, *, settings: GcpSettings | None = None
) -> str | None:
    """One line saying why GCP cannot be used here, or None when it can.

    Needs a project (`GPUOPT_GCP_PROJECT` or config) and Application Default Credentials,
    except against local emulators.
    """
    try:
        current = settings if settings is not None else GcpSettings.from_env()
        if project:
            current = replace(current, project=project)
        if not current.project:
            return f"no GCP project: set {PROJECT_ENV}"
        if not current.needs_adc():
            return None
    except EndpointError as exc:
        return str(exc)
    return adc_problem()
