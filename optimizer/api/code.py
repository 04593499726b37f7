"""/code: the code archives `gpuopt jobs submit` uploads, and the agent's way to fetch its
job's (docs/code.md).

`PUT /code/{sha256}` (the daemon's token) streams the body to a file beside the store,
hashing it as it comes, and keeps it only when its SHA-256 is the one the path names;
`HEAD /code/{sha256}` says whether the daemon holds it. `GET /agent/code/{sha256}` (an
agent's token) serves an archive to the agents of the job that runs it, and to no other.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Header, HTTPException, Request, Response
from fastapi.responses import FileResponse
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from optimizer import answers
from optimizer.api.agent import token_attempt
from optimizer.api.limits import PathLimit
from optimizer.api.state import ApiState, StateDep
from optimizer.code import DEFAULT_MAX_MIB, HASH, MIB, CodeError, CodeStore
from optimizer.jobs.spec import job_spec

PREFIX = "/code"
MAX_BYTES = DEFAULT_MAX_MIB * MIB  # code.max_mib's default
router = APIRouter(prefix=PREFIX, tags=["code"])
agent_router = APIRouter(prefix="/agent", tags=["agent"])


def agent_path(sha256: str) -> str:
    """Where an agent fetches an archive, relative to the daemon's address."""
    return f"/agent{PREFIX}/{sha256}"


def body_limit(max_bytes: int) -> PathLimit:
    """The size cap of an upload, which the body limit (optimizer/api/limits.py) answers
    with 413 before the handler runs, or as soon as a chunked body passes it."""
    return PathLimit(
        PREFIX + "/",
        max_bytes,
        f"code archive over the limit of {max_bytes / MIB:g} MiB ({max_bytes} bytes, "
        "code.max_mib): leave files out with a .gpuoptignore",
    )


def _store(state: ApiState) -> CodeStore:
    if state.code is None:
        raise HTTPException(404, detail="this daemon keeps no code archives")
    return state.code


def _check_hash(sha256: str) -> None:
    if not HASH.fullmatch(sha256):
        raise HTTPException(
            422, detail=f"{sha256[:80]!r} is not a sha256 (64 lowercase hex digits)"
        )


def _unavailable(exc: CodeError) -> HTTPException:
    return HTTPException(503, detail=f"the code store cannot be used: {exc}")


@router.put(
    "/{sha256}",
    response_model=answers.CodeUpload,
    responses={201: {"model": answers.CodeUpload}, 413: {}, 422: {}},
)
async def put_code(
    sha256: str, request: Request, response: Response, state: StateDep
) -> dict[str, Any]:
    """Store a code archive under its SHA-256 (201; 200 when already held)."""
    store = _store(state)
    _check_hash(sha256)
    try:
        held = await run_in_threadpool(store.size, sha256)
    except CodeError as exc:
        raise _unavailable(exc) from None
    if held is not None:
        return {"sha256": sha256, "size": held, "stored": False}
    incoming = store.folder / ".incoming"
    incoming.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f"{sha256[:12]}-", suffix=".part", dir=incoming)
    part = Path(name)
    try:
        digest, size = hashlib.sha256(), 0
        with os.fdopen(fd, "wb") as out:
            try:
                async for chunk in request.stream():  # at most the cap: the body limit
                    size += len(chunk)
                    digest.update(chunk)
                    out.write(chunk)
            except ClientDisconnect:  # cut off, or refused by the body limit
                raise HTTPException(400, detail="the upload was cut short") from None
        found = digest.hexdigest()
        if found != sha256:
            raise HTTPException(
                422,
                detail=f"the body's sha256 is {found}, not {sha256} (the path's): a different "
                "file, or an upload cut short",
            )
        try:
            await run_in_threadpool(store.put, sha256, part)
        except CodeError as exc:
            raise _unavailable(exc) from None
    finally:
        part.unlink(missing_ok=True)
    response.status_code = 201
    return {"sha256": sha256, "size": size, "stored": True}


@router.head("/{sha256}", responses={404: {}, 422: {}})
def head_code(sha256: str, state: StateDep) -> Response:
    """200 with the archive's size as Content-Length when it is held, else 404."""
    store = _store(state)
    if not HASH.fullmatch(sha256):
        return Response(status_code=422)
    try:
        size = store.size(sha256)
    except CodeError:
        return Response(status_code=503)
    if size is None:
        return Response(status_code=404)
    return Response(status_code=200, headers={"content-length": str(size)})


@agent_router.get("/code/{sha256}", response_class=FileResponse, responses={403: {}, 404: {}})
def agent_code(
    sha256: str,
    state: StateDep,
    authorization: Annotated[str | None, Header()] = None,
) -> FileResponse:
    """The archive of the job the agent's attempt runs (403 for any other)."""
    attempt = token_attempt(state, authorization)
    store = _store(state)
    _check_hash(sha256)
    job = state.store.jobs.get_job_by_id(attempt.job_id)
    if job is None or job.removed_at is not None:
        raise HTTPException(403, detail=f"attempt {attempt.key}'s job was removed")
    code = job_spec(job).code
    if code is None or code.sha256 != sha256:
        raise HTTPException(
            403, detail=f"attempt {attempt.key}'s job does not run code sha256:{sha256[:12]}"
        )
    try:
        path = store.path(sha256)
    except CodeError as exc:
        raise _unavailable(exc) from None
    if path is None:
        raise HTTPException(404, detail=f"the daemon no longer holds code sha256:{sha256[:12]}")
    return FileResponse(path, media_type="application/gzip", filename=path.name)
