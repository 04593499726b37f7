"""The daemon's API as the CLI reaches it: its address, its token, one call.

The address is `--api` or `GPUOPT_API_URL` (default http://127.0.0.1:8470); the token is
`GPUOPT_API_TOKEN` or the file the daemon writes, `<data dir>/api-token`. A refused request
ends the command with the daemon's reason (exit 2); a failure inside the daemon exits 1.
"""

from __future__ import annotations

import os
from typing import Annotated, Any

import typer

from optimizer.cli.common import error, fail

DEFAULT_URL = "http://127.0.0.1:8470"

ApiOption = Annotated[
    str | None, typer.Option("--api", help="Daemon API URL (default $GPUOPT_API_URL).")
]


def token() -> str:
    """The API token: GPUOPT_API_TOKEN, else the file the daemon wrote."""
    from optimizer.daemon import settings

    value = os.environ.get("GPUOPT_API_TOKEN", "").strip()
    if value:
        return value
    path = settings.data_dir() / "api-token"
    try:
        return path.read_text().strip()
    except OSError:
        fail(f"no API token: set GPUOPT_API_TOKEN or start the daemon (it writes {path})")


def call(method: str, path: str, api: str | None, **kwargs: Any) -> Any:
    """One request to the daemon; its decoded JSON answer."""
    import httpx

    base = (api or os.environ.get("GPUOPT_API_URL") or DEFAULT_URL).rstrip("/")
    try:
        response = httpx.request(
            method,
            base + path,
            headers={"Authorization": f"Bearer {token()}"},
            timeout=30,
            **kwargs,
        )
    except httpx.HTTPError as exc:
        fail(f"cannot reach the daemon at {base}: {exc.__class__.__name__} (is it running?)")
    if response.status_code >= 400:
        try:
            detail = response.json().get("detail", response.text)
        except ValueError:
            detail = response.text
        if isinstance(detail, list):
            detail = "; ".join(
                f"{'.'.join(map(str, d.get('loc', [])[1:]))}: {d.get('msg')}" for d in detail
            )
        if response.status_code >= 500:  # the daemon failed, not the request
            error(f"{response.status_code}: {detail}")
            raise typer.Exit(1)
        fail(f"{response.status_code}: {detail}")
    return response.json()
