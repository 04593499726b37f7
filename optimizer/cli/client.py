"""The daemon's API as the CLI reaches it: its address, its token, one call.

The address is `--api` or `GPUOPT_API_URL` (default http://127.0.0.1:8470); the token is
`GPUOPT_API_TOKEN` or the file the daemon writes, `<data dir>/api-token`. A refused request
ends the command with the daemon's reason (exit 2); a failure inside the daemon exits 1.
`call` is for commands that need the daemon; `request` lets one that can do without it
(`gpuopt offers --policy`) tell "no daemon answered" (`NoDaemon`) from a daemon that refused.

A command that renders an answer reads it through the answer's model (`read`,
optimizer/answers.py, the models the API declares): an answer that does not fit ends the
command with one line naming the field, not a traceback. The models cost pydantic's import,
so a command imports them inside itself when it runs, never at the CLI's start.

A command makes one or two requests and exits, so they go through the standard library's
`http.client`, which costs a command nothing to import, instead of an HTTP client library
(tens to hundreds of milliseconds of imports on each run). An https:// address is checked
against the system's certificate authorities (`SSL_CERT_FILE` / `SSL_CERT_DIR` name others).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar

import typer

from optimizer.cli.common import error, fail

if TYPE_CHECKING:
    import http.client

    from optimizer.answers import Answer

A = TypeVar("A", bound="Answer")

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


def token_origin() -> str:
    """Where the CLI's token came from, for a refusal (401) to say: the variable, or the file
    and where its folder came from. Never the token itself."""
    if os.environ.get("GPUOPT_API_TOKEN", "").strip():
        return "the token came from GPUOPT_API_TOKEN"
    from optimizer.daemon.settings import DATA_DIR_ENV

    folder = (
        f"its folder from {DATA_DIR_ENV}"
        if os.environ.get(DATA_DIR_ENV)
        else f"the default folder: {DATA_DIR_ENV} is unset"
    )
    return f"the token came from {_token_file()} ({folder})"


def _no_token() -> str:
    return f"no API token: set GPUOPT_API_TOKEN or start the daemon (it writes {_token_file()})"


def token() -> str:
    """The API token: GPUOPT_API_TOKEN, else the file the daemon wrote."""
    found = _find_token()
    if found is None:
        fail(_no_token())
    return found


@dataclass(frozen=True, slots=True)
class Response:
    """The daemon's answer: its status and body."""

    status_code: int
    text: str

    def json(self) -> Any:
        """The body decoded as JSON (ValueError when it is not)."""
        return json.loads(self.text)


def request(
    method: str,
    path: str,
    api: str | None,
    *,
    params: Mapping[str, Any] | None = None,
    json: Any = None,
    upload: Path | None = None,
    timeout: float = 30,
) -> Response:
    """One request to the daemon with its token; NoDaemon when none answers. `upload`: a
    file sent as the body (application/octet-stream) instead of `json`."""
    base, found = base_url(api), _find_token()
    if found is None:
        raise NoDaemon(_no_token())
    headers = {"Authorization": f"Bearer {found}", "Accept": "application/json"}
    try:
        return send(
            method,
            base + path,
            headers,
            params=params,
            body=json,
            upload=upload,
            timeout=timeout,
        )
    except OSError as exc:  # refused, reset, timed out, TLS, name resolution
        raise NoDaemon(f"cannot reach the daemon at {base}: {why(exc)} (is it running?)") from None


def why(exc: OSError) -> str:
    """Why a request got no answer, in a few words."""
    import socket
    import ssl

    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, TimeoutError):
        return "no answer in time"
    if isinstance(exc, socket.gaierror):
        return "unknown host"
    if isinstance(exc, ssl.SSLError):
        return f"TLS: {exc.reason or exc}"
    if type(exc) is ConnectionError and exc.args:  # ours: a bad URL or a broken answer
        return str(exc)
    return exc.__class__.__name__


def send(
    method: str,
    url: str,
    headers: Mapping[str, str],
    *,
    params: Mapping[str, Any] | None = None,
    body: Any = None,
    upload: Path | None = None,
    timeout: float = 30,
) -> Response:
    """`method url?params` with `body` as JSON (when not None), or the file `upload` as the
    body; raises OSError (and its kinds: ConnectionError, TimeoutError, ssl.SSLError) when no
    answer comes."""
    with stream(
        method,
        url,
        headers,
        params=params,
        body=body,
        upload=upload,
        timeout=timeout,
        read_timeout=timeout,
    ) as answer:
        return Response(answer.status, answer.text())


class Streamed:
    """An answer being read: its status, then its body as text pieces as they arrive."""

    def __init__(self, answer: http.client.HTTPResponse) -> None:
        self._answer = answer
        self.status: int = answer.status
        self._charset = _charset(answer.getheader("Content-Type"))

    def pieces(self) -> Iterator[str]:
        """The body, decoded, a piece at a time as the daemon sends it."""
        import codecs

        decoder = codecs.getincrementaldecoder(self._charset)(errors="replace")
        while chunk := self._read(65536):
            if text := decoder.decode(chunk):
                yield text
        if rest := decoder.decode(b"", final=True):
            yield rest

    def text(self) -> str:
        """The whole body, decoded."""
        return "".join(self.pieces())

    def _read(self, size: int) -> bytes:
        import http.client

        try:
            return self._answer.read1(size)
        except http.client.HTTPException as exc:  # cut off mid-answer
            raise ConnectionError(str(exc) or exc.__class__.__name__) from None


@contextmanager
def stream(
    method: str,
    url: str,
    headers: Mapping[str, str],
    *,
    params: Mapping[str, Any] | None = None,
    body: Any = None,
    upload: Path | None = None,
    timeout: float = 30,
    read_timeout: float | None = 30,
) -> Iterator[Streamed]:
    """Send the request and hold its answer open while the block reads it (see `send`);
    `timeout` bounds connecting and waiting for the answer's head, `read_timeout` each read
    of its body (None: a read may wait for ever, as a follower does)."""
    import http.client
    from urllib.parse import urlencode, urlsplit

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConnectionError(f"not an http(s) URL: {url}")
    target = parts.path or "/"
    query = "&".join(q for q in (parts.query, urlencode(params or {}, doseq=True)) if q)
    if query:
        target += "?" + query
    sent = dict(headers)
    data: Any = None
    if body is not None:
        data = json.dumps(body).encode()
        sent["Content-Type"] = "application/json"
    elif upload is not None:
        data = open(upload, "rb")  # noqa: SIM115 (closed below, after the request)
        sent["Content-Type"] = "application/octet-stream"
        sent["Content-Length"] = str(os.fstat(data.fileno()).st_size)
    connection: http.client.HTTPConnection
    if parts.scheme == "https":
        import ssl

        connection = http.client.HTTPSConnection(
            parts.hostname, parts.port, timeout=timeout, context=ssl.create_default_context()
        )
    else:
        connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    try:
        try:
            connection.request(method, target, body=data, headers=sent)
            answer = connection.getresponse()
        except http.client.HTTPException as exc:  # a malformed answer
            raise ConnectionError(str(exc) or exc.__class__.__name__) from None
        if connection.sock is not None and read_timeout != timeout:
            connection.sock.settimeout(read_timeout)
        yield Streamed(answer)
    finally:
        connection.close()
        if upload is not None and data is not None:
            data.close()


def _charset(content_type: str | None) -> str:
    for part in (content_type or "").split(";")[1:]:
        name, _, value = part.strip().partition("=")
        if name.lower() == "charset" and value:
            return value.strip('"')
    return "utf-8"


def detail(response: Response) -> str:
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


def check(response: Response) -> Any:
    """The answer's decoded JSON; a refusal ends the command (exit 2, 1 if the daemon failed)."""
    if response.status_code >= 400:
        if response.status_code >= 500:  # the daemon failed, not the request
            error(f"{response.status_code}: {detail(response)}")
            raise typer.Exit(1)
        if response.status_code == 401:
            fail(
                f"401: {detail(response)}: {token_origin()}; it is not the token of the daemon "
                "at this address (--api, GPUOPT_API_URL)"
            )
        fail(f"{response.status_code}: {detail(response)}")
    try:
        return response.json()
    except ValueError:
        unreadable("not JSON")


def unreadable(what: str) -> NoReturn:
    """End the command (exit 1): the daemon's answer does not fit what this CLI reads."""
    error(f"the daemon answered something this gpuopt cannot read: {what} (versions differ?)")
    raise typer.Exit(1)


def read(model: type[A], answer: Any) -> A:
    """`answer` (decoded JSON) as `model`; one that does not fit ends the command (exit 1),
    naming the first field that does not and why."""
    from pydantic import ValidationError

    try:
        return model.model_validate(answer)
    except ValidationError as exc:
        problem = exc.errors(include_url=False)[0]
        where = ".".join(str(part) for part in problem["loc"])
        unreadable(f"{model.__name__}{'.' + where if where else ''}: {problem['msg']}")


def call(method: str, path: str, api: str | None, **kwargs: Any) -> Any:
    """One request to the daemon; its decoded JSON answer."""
    try:
        response = request(method, path, api, **kwargs)
    except NoDaemon as exc:
        fail(str(exc))
    return check(response)
