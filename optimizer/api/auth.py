"""Bearer-token auth for the operator API: one shared token, compared in constant time."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, HTTPException, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from optimizer.api.state import StateDep

_bearer = HTTPBearer(auto_error=False, description="The daemon's API token (api.token).")


def require_token(
    state: StateDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """401 unless the request carries `Authorization: Bearer <the API token>`."""
    expected = state.token.get_secret_value().encode()
    given = credentials.credentials.encode() if credentials is not None else b""
    if credentials is None or not hmac.compare_digest(given, expected):
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            detail="missing or wrong bearer token",
            headers={"WWW-Authenticate": 'Bearer realm="gpuopt"'},
        )
