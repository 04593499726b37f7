"""The console's session cookie: signed, expiring, and never the token itself.

The cookie holds a random session id, when it was issued and when it expires, signed with
HMAC-SHA256 under a key derived from the daemon's API token. Every replica that shares the
token accepts it (no session table), a new token ends every session, and the cookie says
nothing about the token. The CSRF token of a session is an HMAC of its id under the same key,
so forms carry it and the server checks it without storing anything. Pure: the time is an
argument.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass
from datetime import datetime

COOKIE = "gpuopt_session"
PATH = "/ui"
LIFETIME_S = 12 * 3600
_KEY_LABEL = b"gpuopt web console session v1"


@dataclass(frozen=True, slots=True)
class Session:
    sid: str
    issued: int  # epoch seconds
    expires: int


def _key(token: str) -> bytes:
    return hmac.new(token.encode(), _KEY_LABEL, hashlib.sha256).digest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _mac(key: bytes, label: bytes, payload: bytes) -> str:
    return _b64(hmac.new(key, label + payload, hashlib.sha256).digest())


def issue(token: str, now: datetime, lifetime_s: int = LIFETIME_S) -> tuple[str, Session]:
    """A new session's cookie value and the session."""
    at = int(now.timestamp())
    session = Session(secrets.token_urlsafe(18), at, at + lifetime_s)
    payload = json.dumps(
        {"sid": session.sid, "iat": session.issued, "exp": session.expires},
        separators=(",", ":"),
    ).encode()
    body = _b64(payload)
    return f"{body}.{_mac(_key(token), b'session:', body.encode())}", session


def verify(token: str, value: str | None, now: datetime) -> Session | None:
    """The session a cookie value stands for; None when it is missing, altered, malformed or
    expired (or was issued under another token). Any text is only that: a value we never
    issue (non-ASCII included) is no session, never an error."""
    if not value or not value.isascii() or value.count(".") != 1 or len(value) > 512:
        return None
    body, mac = value.split(".")
    if not hmac.compare_digest(
        mac.encode(), _mac(_key(token), b"session:", body.encode()).encode()
    ):
        return None
    try:
        data = json.loads(_unb64(body))
        session = Session(str(data["sid"]), int(data["iat"]), int(data["exp"]))
    except (ValueError, KeyError, TypeError, binascii.Error):
        return None
    if not session.issued - 60 <= now.timestamp() < session.expires:
        return None
    return session


def csrf_token(token: str, session: Session) -> str:
    """The value a form of this session carries to prove it came from a console page."""
    return _mac(_key(token), b"csrf:", session.sid.encode())


def csrf_ok(token: str, session: Session, given: str | None) -> bool:
    """`given` is the session's CSRF token (any text compared as UTF-8 bytes: a non-ASCII
    one is only wrong, since compare_digest refuses non-ASCII str)."""
    if not given:
        return False
    expected = csrf_token(token, session).encode()
    return hmac.compare_digest(str(given).encode("utf-8", "surrogateescape"), expected)
