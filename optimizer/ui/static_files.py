"""/ui/static/: the console's own CSS and JavaScript and the vendored chart library, read
from the package (VENDORED.md in the folder records what was vendored, its version and
licence). Open like /healthz: they hold no data, and the sign-in page needs them."""

from __future__ import annotations

from functools import cache
from importlib import resources

from fastapi import APIRouter, HTTPException
from fastapi.responses import Response

router = APIRouter(prefix="/ui/static", include_in_schema=False)

TYPES = {
    ".css": "text/css; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".svg": "image/svg+xml",
}


@cache
def _read(name: str) -> bytes | None:
    if "/" in name or "\\" in name or name.startswith(".") or not name.endswith(tuple(TYPES)):
        return None
    resource = resources.files("optimizer.ui").joinpath("static", name)
    return resource.read_bytes() if resource.is_file() else None


@router.get("/{name}")
def static(name: str) -> Response:
    body = _read(name)
    if body is None:
        raise HTTPException(404, detail="no such file")
    kind = TYPES[name[name.rindex(".") :]]
    return Response(
        body,
        media_type=kind,
        headers={"Cache-Control": "public, max-age=3600", "X-Content-Type-Options": "nosniff"},
    )
