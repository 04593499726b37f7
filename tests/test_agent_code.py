"""The agent's side of code archives: fetched from the daemon, checked, unpacked once per
disk; failures are retried with the back-off, then said in one clear message."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import httpx
import pytest

from optimizer.agent import Agent, AgentConfig
from optimizer.agent.code import CodeUnavailable, Interrupted, prepare
from optimizer.agent.reporter import DaemonClient, DaemonError
from optimizer.code import sha256_file
from optimizer.common.retry import Backoff
from optimizer.protocol import CodeArchive
from tests.helpers.agent_loop import ScriptedDaemon, ScriptedWatcher, job
from tests.helpers.code_archive import archive

BASE = "http://daemon.test:8470"


def client(answers: list[httpx.Response], seen: list[httpx.Request]) -> DaemonClient:
    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return answers.pop(0) if len(answers) > 1 else answers[0]

    transport = httpx.MockTransport(handle)
    return DaemonClient(BASE, "agent-token", "1-1", client=httpx.Client(transport=transport))


def fast() -> Backoff:
    return Backoff(base=0.001, cap=0.001, rng=lambda: 0.0)


def test_fetched_checked_unpacked_then_reused(tmp_path: Path) -> None:
    code, body = archive(tmp_path)
    seen: list[httpx.Request] = []
    root = tmp_path / "disk" / "code"
    folder = prepare(client([httpx.Response(200, content=body)], seen), code, root)
    assert folder == root / code.sha256 and (folder / "train.py").read_text() == "print('hi')\n"
    assert [str(r.url) for r in seen] == [f"{BASE}/agent/code/{code.sha256}"]
    assert seen[0].headers["authorization"] == "Bearer agent-token"
    assert sorted(p.name for p in root.iterdir()) == [code.sha256]  # no partial file left
    # a later attempt on the same disk fetches nothing
    again = prepare(client([httpx.Response(500)], seen), code, root)
    assert again == folder and len(seen) == 1


def test_transient_failures_are_retried(tmp_path: Path) -> None:
    code, body = archive(tmp_path)
    seen: list[httpx.Request] = []
    answers = [httpx.Response(503), httpx.Response(200, content=b"truncated"),
               httpx.Response(200, content=body)]  # fmt: skip
    waits: list[float] = []
    folder = prepare(
        client(answers, seen),
        code,
        tmp_path / "code",
        backoff=fast(),
        wait=lambda s: waits.append(s) or True,
    )
    assert folder.is_dir() and len(seen) == 3 and len(waits) == 2


def test_a_refusal_is_not_retried_and_is_said_clearly(tmp_path: Path) -> None:
    code, _ = archive(tmp_path)
    seen: list[httpx.Request] = []
    refused = httpx.Response(403, json={"detail": "attempt 1-1's job does not run code"})
    with pytest.raises(CodeUnavailable) as caught:
        prepare(client([refused], seen), code, tmp_path / "code", backoff=fast())
    assert str(caught.value) == (
        f"cannot fetch code sha256:{code.sha256[:12]} from the daemon: "
        f"/agent/code/{code.sha256} answered 403: attempt 1-1's job does not run code"
    )
    assert len(seen) == 1 and not (tmp_path / "code" / code.sha256).exists()


def test_another_hash_every_time_gives_up_after_the_tries(tmp_path: Path) -> None:
    code, _ = archive(tmp_path)
    seen: list[httpx.Request] = []
    with pytest.raises(CodeUnavailable, match="has sha256 .*, not " + code.sha256):
        prepare(
            client([httpx.Response(200, content=b"other")], seen),
            code,
            tmp_path / "code",
            backoff=fast(),
            tries=3,
        )
    assert len(seen) == 3


def test_a_stop_while_waiting_to_retry_interrupts(tmp_path: Path) -> None:
    code, _ = archive(tmp_path)
    with pytest.raises(Interrupted):
        prepare(
            client([httpx.Response(502)], []),
            code,
            tmp_path / "code",
            backoff=fast(),
            wait=lambda _s: False,
        )


def test_an_unsafe_archive_is_refused(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        info = tarfile.TarInfo("../escape.txt")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    evil = tmp_path / "evil.tar.gz"
    evil.write_bytes(buffer.getvalue())
    sha = sha256_file(evil)
    code = CodeArchive(sha256=sha, size=len(buffer.getvalue()), url=f"/agent/code/{sha}")
    with pytest.raises(CodeUnavailable, match=r"'\.\.' component leaves the folder"):
        prepare(client([httpx.Response(200, content=evil.read_bytes())], []), code, tmp_path / "c")
    assert not (tmp_path / "escape.txt").exists()


class RefusingDaemon(ScriptedDaemon):
    """A scripted daemon whose code route refuses the agent."""

    def download(self, url: str, dest: Path, *, timeout_s: float = 300.0) -> None:
        raise DaemonError(f"{url} answered 403: not this job's code", retryable=False, status=403)


def test_an_agent_that_cannot_get_the_code_fails_the_job_clearly(tmp_path: Path) -> None:
    code, _ = archive(tmp_path)
    answer = job(tmp_path, 3, code=code.wire())
    daemon = RefusingDaemon(answer)
    config = AgentConfig(
        daemon_url="http://d",
        token="t",
        attempt_key="train/1",
        metadata_kind="aws-imds",
        cloud="local",
        agent_dir=tmp_path / "disk" / "agent",
        flush_s=2.0,
    )
    agent = Agent(
        config,
        client=daemon,  # type: ignore[arg-type]
        watcher=ScriptedWatcher(),
        register_backoff=Backoff(base=0.01, cap=0.02),
        send_backoff=Backoff(base=0.01, cap=0.05),
    )
    assert agent.run() == 1
    assert daemon.kinds() == ["code_failed", "job_exited"]  # the job never started
    why = (
        f"cannot fetch code sha256:{code.sha256[:12]} from the daemon: "
        f"/agent/code/{code.sha256} answered 403: not this job's code"
    )
    failed, exited = (e for e in daemon.events if e.kind != "heartbeat")
    assert failed.data == {"sha256": code.sha256, "error": why}
    assert exited.data["exit_code"] == 1 and exited.data["phase"] == "code"
    assert exited.data["error"] == why
    assert why in daemon.output("stderr")  # in the job's output too
    assert not (tmp_path / "disk" / "code" / code.sha256).exists()
    assert not (tmp_path / "ckpt" / "state.json").exists()
