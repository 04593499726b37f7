"""google-cloud-compute and google-cloud-billing clients, made on first use.

The SDKs are imported here, inside functions, so importing `providers.gcp` stays cheap and
`gpuopt --help` never loads them. Every client speaks REST (Compute has no other transport;
the Cloud Billing client is switched to it so one endpoint override style serves both). An
`http://` loopback endpoint is emulator mode: anonymous credentials, as Google's own emulators
use (REFERENCE §2.7).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from providers.gcp.settings import (
    BILLING_ENDPOINT_ENV,
    COMPUTE_ENDPOINT_ENV,
    GcpSettings,
    endpoint_is_emulator,
)

DEFAULT_TRANSPORT = "rest"


def _endpoint(options: Any) -> str | None:
    if options is None:
        return None
    if isinstance(options, Mapping):
        return options.get("api_endpoint")
    return getattr(options, "api_endpoint", None)


def _api_key(options: Any) -> str | None:
    if isinstance(options, Mapping):
        return options.get("api_key")
    return getattr(options, "api_key", None)


def _without_api_key(options: Any) -> Any:
    if isinstance(options, Mapping):
        return {k: v for k, v in options.items() if k != "api_key"}
    from google.api_core.client_options import ClientOptions

    return ClientOptions(api_endpoint=_endpoint(options))


def options_from_settings(settings: GcpSettings) -> tuple[dict[str, str], dict[str, str]]:
    """(compute, billing) client options for the endpoint overrides and billing API key."""
    compute: dict[str, str] = {}
    billing: dict[str, str] = {}
    if settings.compute_endpoint:
        compute["api_endpoint"] = settings.compute_endpoint
    if settings.billing_endpoint:
        billing["api_endpoint"] = settings.billing_endpoint
    if settings.billing_api_key:
        billing["api_key"] = settings.billing_api_key
    return compute, billing


class Clients:
    """One client per Compute/Billing service, made once, shared by the provider's threads."""

    def __init__(
        self,
        *,
        credentials: Any = None,
        compute_options: Any = None,
        billing_options: Any = None,
        transport: str | None = None,
    ) -> None:
        # Raises EndpointError for an http:// endpoint that is not on this machine.
        self._compute_emulated = endpoint_is_emulator(
            _endpoint(compute_options), COMPUTE_ENDPOINT_ENV
        )
        self._billing_emulated = endpoint_is_emulator(
            _endpoint(billing_options), BILLING_ENDPOINT_ENV
        )
        self._credentials = credentials
        self._compute_options = compute_options
        self._billing_options = billing_options
        self._transport = transport or DEFAULT_TRANSPORT
        self._made: dict[str, Any] = {}
        self._lock = threading.Lock()

    def _credentials_for(self, emulated: bool) -> Any:
        if self._credentials is not None:
            return self._credentials
        if emulated:
            from google.auth.credentials import AnonymousCredentials

            return AnonymousCredentials()
        return None  # Application Default Credentials, resolved by the client

    def _get(self, name: str, make: Callable[[], Any]) -> Any:
        with self._lock:
            client = self._made.get(name)
            if client is None:
                client = self._made[name] = make()
            return client

    def _compute(self, class_name: str) -> Any:
        def make() -> Any:
            from google.cloud import compute_v1

            cls = getattr(compute_v1, class_name)
            return cls(
                transport=self._transport,
                client_options=self._compute_options,
                credentials=self._credentials_for(self._compute_emulated),
            )

        return self._get(class_name, make)

    @property
    def accelerator_types(self) -> Any:
        return self._compute("AcceleratorTypesClient")

    @property
    def machine_types(self) -> Any:
        return self._compute("MachineTypesClient")

    @property
    def instances(self) -> Any:
        return self._compute("InstancesClient")

    @property
    def resource_policies(self) -> Any:
        return self._compute("ResourcePoliciesClient")

    @property
    def zone_operations(self) -> Any:
        return self._compute("ZoneOperationsClient")

    @property
    def catalog(self) -> Any:
        def make() -> Any:
            from google.cloud import billing_v1

            options = self._billing_options
            credentials = self._credentials_for(self._billing_emulated)
            if _api_key(options):
                if credentials is not None:
                    # The two are exclusive in google-api-core; explicit credentials win.
                    options = _without_api_key(options)
                else:
                    credentials = None
            return billing_v1.CloudCatalogClient(
                transport=self._transport, client_options=options, credentials=credentials
            )

        return self._get("CloudCatalogClient", make)

    def close(self) -> None:
        with self._lock:
            made, self._made = self._made, {}
        for client in made.values():
            transport = getattr(client, "transport", None)
            if transport is not None:
                transport.close()
