"""Code archives over HTTP on a real loopback daemon: upload under the daemon's token with
the hash checked, HEAD, the size cap, and agents fetching their own job's archive only."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from optimizer.code import pack
from optimizer.daemon.service import Daemon
from tests.helpers.code_api import POLICY, SPEC, attempt
from tests.helpers.daemon import api, make_config, running, without_job_passes
from tests.helpers.offers import T0
from tests.helpers.policies import write_policy

pytestmark = pytest.mark.usefixtures("daemon_env")

CAP_MIB = 1


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    write_policy(tmp_path / "policies", "p.yaml", POLICY)
    config = make_config(
        tmp_path / "data", policy_dir=tmp_path / "policies", code={"max_mib": CAP_MIB}
    )
    with running(config) as d:
        without_job_passes(d)  # the tests play the jobs' agents
        yield d


def archive_of(tmp_path: Path, text: str) -> tuple[str, bytes]:
    folder = tmp_path / f"proj-{hashlib.sha256(text.encode()).hexdigest()[:8]}"
    folder.mkdir()
    (folder / "main.py").write_text(text)
    packed = pack(folder, tmp_path / "out")
    return packed.sha256, packed.path.read_bytes()


def agent_get(daemon: Daemon, token: str, sha256: str) -> httpx.Response:
    with httpx.Client(base_url=daemon.url, timeout=30) as client:
        return client.get(f"/agent/code/{sha256}", headers={"Authorization": f"Bearer {token}"})


def test_upload_then_head_then_upload_again(daemon: Daemon, tmp_path: Path) -> None:
    sha, body = archive_of(tmp_path, "print('hi')\n")
    with api(daemon) as client:
        assert client.head(f"/code/{sha}").status_code == 404
        stored = client.put(f"/code/{sha}", content=body)
        assert stored.status_code == 201, stored.text
        assert stored.json() == {"sha256": sha, "size": len(body), "stored": True}
        held = client.head(f"/code/{sha}")
        assert held.status_code == 200 and held.headers["content-length"] == str(len(body))
        again = client.put(f"/code/{sha}", content=body)
        assert again.status_code == 200 and again.json()["stored"] is False
    kept = daemon.config.effective_data_dir / "code" / f"{sha}.tar.gz"
    assert kept.read_bytes() == body
    assert list((kept.parent / ".incoming").iterdir()) == []


def test_upload_needs_the_daemon_token(daemon: Daemon, tmp_path: Path) -> None:
    sha, body = archive_of(tmp_path, "x = 1\n")
    with api(daemon, token="wrong-token") as client:
        assert client.put(f"/code/{sha}", content=body).status_code == 401
        assert client.head(f"/code/{sha}").status_code == 401
    with api(daemon) as client:
        assert client.head(f"/code/{sha}").status_code == 404


def test_a_body_of_another_hash_is_422_naming_both(daemon: Daemon, tmp_path: Path) -> None:
    sha, body = archive_of(tmp_path, "a = 1\n")
    other, _ = archive_of(tmp_path, "b = 2\n")
    with api(daemon) as client:
        refused = client.put(f"/code/{other}", content=body)
        assert refused.status_code == 422
        assert refused.json()["detail"] == (
            f"the body's sha256 is {sha}, not {other} (the path's): a different file, or an "
            "upload cut short"
        )
        assert client.head(f"/code/{other}").status_code == 404
    assert list((daemon.config.effective_data_dir / "code" / ".incoming").iterdir()) == []


@pytest.mark.parametrize("bad", ["abc", "A" * 64, "g" * 64, "0" * 65])
def test_a_malformed_hash_is_422(daemon: Daemon, bad: str) -> None:
    with api(daemon) as client:
        refused = client.put(f"/code/{bad}", content=b"x")
        assert refused.status_code == 422
        assert "is not a sha256 (64 lowercase hex digits)" in refused.json()["detail"]
        assert client.head(f"/code/{bad}").status_code == 422


def test_an_archive_over_the_cap_is_413_naming_it(daemon: Daemon) -> None:
    body = b"\0" * (CAP_MIB * (1 << 20) + 1)
    sha = hashlib.sha256(body).hexdigest()
    with api(daemon) as client:
        refused = client.put(f"/code/{sha}", content=body)
        assert refused.status_code == 413
        assert "over the limit of 1 MiB (1048576 bytes, code.max_mib)" in refused.json()["detail"]

        def chunked() -> Iterator[bytes]:  # no Content-Length: counted as it streams in
            for _ in range(CAP_MIB * 4 + 1):
                yield b"\0" * (1 << 18)

        try:
            streamed = client.put(f"/code/{sha}", content=chunked())
        except httpx.TransportError:
            pass  # the daemon may close the connection while the body is still being sent
        else:
            assert streamed.status_code == 413
        assert client.head(f"/code/{sha}").status_code == 404


def test_a_job_whose_code_was_not_uploaded_is_refused(daemon: Daemon) -> None:
    spec = {**SPEC, "policy": "p", "code": {"sha256": "1" * 64, "size": 10}}
    with api(daemon) as client:
        refused = client.post("/jobs", json=spec)
    assert refused.status_code == 422
    (problem,) = refused.json()["detail"]
    assert problem["loc"] == ["body", "code", "sha256"]
    assert "holds no code archive sha256:" + "1" * 64 in problem["msg"]


def test_an_agent_fetches_its_own_jobs_archive_and_no_other(daemon: Daemon, tmp_path: Path) -> None:
    mine, mine_body = archive_of(tmp_path, "mine\n")
    theirs, theirs_body = archive_of(tmp_path, "theirs\n")
    with api(daemon) as client:
        for sha, body in ((mine, mine_body), (theirs, theirs_body)):
            assert client.put(f"/code/{sha}", content=body).status_code == 201
    store = daemon.store
    job_a = store.jobs.add_job(
        "a", "p", {**SPEC, "code": {"sha256": mine, "size": len(mine_body)}}, at=T0
    )
    job_b = store.jobs.add_job(
        "b", "p", {**SPEC, "code": {"sha256": theirs, "size": len(theirs_body)}}, at=T0
    )
    job_c = store.jobs.add_job("c", "p", SPEC, at=T0)  # runs no archive
    token_a, token_b, token_c = (attempt(daemon, j, 1) for j in (job_a, job_b, job_c))

    got = agent_get(daemon, token_a, mine)
    assert got.status_code == 200 and got.content == mine_body
    assert agent_get(daemon, token_b, theirs).content == theirs_body

    refused = agent_get(daemon, token_b, mine)
    assert refused.status_code == 403
    assert (
        refused.json()["detail"] == f"attempt {job_b}-1's job does not run code sha256:{mine[:12]}"
    )
    assert agent_get(daemon, token_c, mine).status_code == 403
    assert agent_get(daemon, "not-a-token", mine).status_code == 401
    # The daemon's own token is not an agent's.
    from tests.helpers.daemon import TOKEN

    assert agent_get(daemon, TOKEN, mine).status_code == 401


def test_the_register_answer_says_where_the_code_is(daemon: Daemon, tmp_path: Path) -> None:
    sha, body = archive_of(tmp_path, "code\n")
    with api(daemon) as client:
        assert client.put(f"/code/{sha}", content=body).status_code == 201
    spec = {**SPEC, "workdir": "sub", "code": {"sha256": sha, "size": len(body)}}
    job = daemon.store.jobs.add_job("a", "p", spec, at=T0)
    token = attempt(daemon, job, 1)
    with httpx.Client(base_url=daemon.url, timeout=30) as client:
        answer = client.post(
            "/agent/v1/register",
            json={"attempt_key": f"{job}-1", "instance_id": "i-1"},
            headers={"Authorization": f"Bearer {token}"},
        )
    assert answer.status_code == 200, answer.text
    sent = answer.json()["job"]
    assert sent["code"] == {"sha256": sha, "size": len(body), "url": f"/agent/code/{sha}"}
    assert sent["workdir"] == "sub"
    # a job without code has no `code` key at all
    plain = daemon.store.jobs.add_job("b", "p", SPEC, at=T0)
    plain_token = attempt(daemon, plain, 1)
    with httpx.Client(base_url=daemon.url, timeout=30) as client:
        answer = client.post(
            "/agent/v1/register",
            json={"attempt_key": f"{plain}-1"},
            headers={"Authorization": f"Bearer {plain_token}"},
        )
    assert answer.status_code == 200, answer.text
    assert "code" not in answer.json()["job"]


def test_the_code_section_of_the_daemon_config(monkeypatch: pytest.MonkeyPatch) -> None:
    from pydantic import ValidationError

    from optimizer.daemon.config import DaemonConfig

    assert DaemonConfig().code.max_mib == 512 and DaemonConfig().code.store is None
    monkeypatch.setenv("GPUOPT_CODE__MAX_MIB", "64")
    monkeypatch.setenv("GPUOPT_CODE__STORE", "s3://team-code/archives")
    config = DaemonConfig()
    assert (config.code.max_mib, config.code.store) == (64, "s3://team-code/archives")
    monkeypatch.delenv("GPUOPT_CODE__STORE")
    monkeypatch.delenv("GPUOPT_CODE__MAX_MIB")  # the environment outranks the values below
    with pytest.raises(ValidationError, match="must be a bucket URI"):
        DaemonConfig(code={"store": "team-code"})
    with pytest.raises(ValidationError, match="greater than or equal to 1"):
        DaemonConfig(code={"max_mib": 0})
