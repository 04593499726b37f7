"""The daemon's API as the CLI reaches it: its address, its token, one call.

The address is `--api` or `GPUOPT_API_URL` (default http://127.0.0.1:8470); the token is
`GPUOPT_API_TOKEN` or the file the daemon writes, `<data dir>/api-token`. A refused request
ends the command with the daemon's reason (exit 2); a failure inside the daemon exits 1.
`call` is for commands that need the daemon; `request` lets one that can do without it
(`gpuopt offers --policy`) tell "no daemon answered" (`NoDaemon`) from a daemon that refused.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from optimizer.cli.common import error, fail

if TYPE_CHECKING:
    import httpx

DEFAULT_URL = "http://127.0.0.1:8470"

ApiOption = Annotated[
    str | None, typer.Option("--api", help="Daemon API URL (default $GPUOPT_API_URL).")
]


class NoDaemon(Exception):
    """No daemon answered: nothing answers at the address, or no token is known."""


def base_url(api: str | None) -> str:
    """The daemon's address: `api`, else GPUOPT_API_URL, else the default."""
    return (api or os.environ.get("GPUOPT_API_URL") or DEFAULT_URL).rstrip("/")


def _token_file() -> Path:
    from optimizer.daemon import settings

    return settings.data_dir() / "api-token"


def _find_token() -> str | None:
    value = os.environ.get("GPUOPT_API_TOKEN", "").strip()
    if value:
        return value
    try:
        return _token_file().read_text().strip()
    except OSError:
        return None


def _no_token() -> str:
    return f"no API token: set GPUOPT_API_TOKEN or start the daemon (it writes {_token_file()})"


def token() -> str:
    """The API token: GPUOPT_API_TOKEN, else the file the daemon wrote."""
    found = _find_token()
    if found is None:
        fail(_no_token())
    return found


def request(method: str, path: str, api: str | None, **kwargs: Any) -> httpx.Response:
    """One request to the daemon with its token; NoDaemon when none answers."""
    import httpx

    base, found = base_url(api), _find_token()
    if found is None:
        raise NoDaemon(_no_token())
    try:
        return httpx.request(
            method, base + path, headers={"Authorization": f"Bearer {found}"}, timeout=30, **kwargs
        )
    except httpx.HTTPError as exc:
        raise NoDaemon(
            f"cannot reach the daemon at {base}: {exc.__class__.__name__} (is it running?)"
        ) from None


def detail(response: httpx.Response) -> str:
    """A refusal's reason in one line (a 422's fields joined)."""
    try:
        found = response.json().get("detail", response.text)
    except ValueError:
        found = response.text
    if isinstance(found, list):
        found = "; ".join(
            f"{'.'.join(map(str, d.get('loc', [])[1:]))}: {d.get('msg')}" for d in found
        )
    return str(found)


def check(response: httpx.Response) -> Any:
    """The answer's decoded JSON; a refusal ends the command (exit 2, 1 if the daemon failed)."""
    if response.status_code >= 400:
        if response.status_code >= 500:  # the daemon failed, not the request
            error(f"{response.status_code}: {detail(response)}")
            raise typer.Exit(1)
        fail(f"{response.status_code}: {detail(response)}")
    return response.json()


def call(method: str, path: str, api: str | None, **kwargs: Any) -> Any:
    """One request to the daemon; its decoded JSON answer."""
    try:
        response = request(method, path, api, **kwargs)
    except NoDaemon as exc:
        fail(str(exc))
    return check(response)
