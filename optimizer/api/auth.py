"""Bearer-token auth for the operator API: one shared token, compared in constant time, and
wrong tokens throttled per client address (`check_token`, which the auth gate in front of the
app and the console's sign-in use; optimizer/api/throttle.py)."""

from __future__ import annotations

import enum
import hmac
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, HTTPException, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from optimizer.api.state import ApiState, StateDep

_bearer = HTTPBearer(auto_error=False, description="The daemon's API token (api.token).")


class Outcome(enum.Enum):
    PASSED = "passed"
    MISSING = "missing"  # no token at all: not a guess, not counted
    WRONG = "wrong"  # counted against the address
    THROTTLED = "throttled"  # not checked: the address must wait `retry_after_s`


@dataclass(frozen=True, slots=True)
class TokenVerdict:
    outcome: Outcome
    retry_after_s: int = 0


def token_matches(state: ApiState, given: str) -> bool:
    """`given` is the API token (constant time; any text, non-ASCII included, is compared
    as UTF-8 bytes, never refused with an error)."""
    expected = state.token.get_secret_value().encode()
    return hmac.compare_digest(given.encode("utf-8", "surrogateescape"), expected)


def check_token(
    state: ApiState, address: str, given: str | None, *, missing_counts: bool = False
) -> TokenVerdict:
    """The verdict on a token presented from `address`: while the address is throttled for
    wrong tokens every token waits, the right one too (SECURITY.md says why); else a wrong
    one is counted against the address. No token at all is MISSING and not counted, unless
    `missing_counts` (a sign-in form sent empty is an attempt). The time is the daemon's
    injected clock."""
    if not given and not missing_counts:
        return TokenVerdict(Outcome.MISSING)
    now = state.clock().timestamp()
    wait = state.auth_throttle.retry_after(address, now)
    if wait is not None:
        return TokenVerdict(Outcome.THROTTLED, wait)
    if given and token_matches(state, given):
        return TokenVerdict(Outcome.PASSED)
    state.auth_throttle.failed(address, now)
    return TokenVerdict(Outcome.WRONG)


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
