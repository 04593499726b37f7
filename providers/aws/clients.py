"""boto3 sessions and clients: the standard credential chain, adaptive retries, endpoints.

boto3 is imported here, inside functions, so importing `providers.aws` stays cheap and
`gpuopt --help` never loads it.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from providers.aws.errors import NO_CREDENTIALS

# Retry and timeout settings. Adaptive = standard retries (exponential backoff with jitter,
# RequestLimitExceeded retried) plus a client-side token bucket that slows down after throttles
# (https://docs.aws.amazon.com/boto3/latest/guide/retries.html).
MAX_ATTEMPTS = 5
CONNECT_TIMEOUT_S = 5
READ_TIMEOUT_S = 30
# SQS long polls hold the connection for up to 20 s (WaitTimeSeconds), so reads wait longer.
SQS_READ_TIMEOUT_S = 40
DEFAULT_REGION = "us-east-1"


def new_session(**kwargs: Any) -> Any:
    """A boto3 Session: the standard chain (env, profile, SSO, container, instance role)."""
    import boto3

    return boto3.session.Session(**kwargs)


def aws_disabled_reason(session: Any = None) -> str | None:
    """One line saying why AWS cannot be used here, or None when credentials are found.

    Resolves the credential chain only; no AWS API is called.
    """
    try:
        if session is None:
            session = new_session()
        credentials = session.get_credentials()
    except ImportError:
        return "boto3 is not installed"
    except Exception as exc:  # a broken profile or credential process: say so, stay disabled
        return f"AWS credentials could not be loaded ({type(exc).__name__}: {exc})"
    if credentials is None:
        return NO_CREDENTIALS
    return None


class Clients:
    """Thread-safe cache of one client per (service, region).

    boto3 clients are thread-safe once made, but making them from one Session is not, so
    creation happens under a lock. `endpoint_url` is one URL for every service or a
    {service: URL} mapping; without it boto3's own settings apply (`AWS_ENDPOINT_URL`,
    `AWS_ENDPOINT_URL_EC2`, the `services` section of ~/.aws/config).
    """

    def __init__(
        self,
        session: Any,
        *,
        endpoint_url: str | Mapping[str, str] | None = None,
        max_pool_connections: int = 10,
    ) -> None:
        self.session = session
        self._endpoint_url = endpoint_url
        self._pool = max(10, max_pool_connections)
        self._lock = threading.Lock()
        self._clients: dict[tuple[str, str], Any] = {}

    def endpoint_for(self, service: str) -> str | None:
        if isinstance(self._endpoint_url, Mapping):
            return self._endpoint_url.get(service)
        return self._endpoint_url

    def get(self, service: str, region: str) -> Any:
        key = (service, region)
        with self._lock:
            client = self._clients.get(key)
            if client is None:
                client = self._make(service, region)
                self._clients[key] = client
            return client

    def _make(self, service: str, region: str) -> Any:
        from botocore.config import Config

        config = Config(
            retries={"mode": "adaptive", "max_attempts": MAX_ATTEMPTS},
            connect_timeout=CONNECT_TIMEOUT_S,
            read_timeout=SQS_READ_TIMEOUT_S if service == "sqs" else READ_TIMEOUT_S,
            max_pool_connections=self._pool,
        )
        kwargs: dict[str, Any] = {"region_name": region, "config": config}
        endpoint = self.endpoint_for(service)
        if endpoint:
            kwargs["endpoint_url"] = endpoint
        return self.session.client(service, **kwargs)
