"""The `owned-file` watcher: a drain notice the daemon writes into a file on an owned machine."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest

from optimizer.agent.config import AgentConfig, AgentConfigError
from optimizer.agent.imds import (
    WATCHERS,
    Notice,
    OwnedFile,
    OwnedFileError,
    make_watcher,
    watch,
)
from optimizer.protocol import power_off_time
from tests.helpers.waiting import wait_until

NOTICED = datetime(2026, 1, 2, 3, 0, tzinfo=UTC)


def _write(path: Path, time: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"action": "terminate", "time": time, "reason": "drain"}))
    tmp.replace(path)  # as the daemon writes it: whole or not at all


class _Counting:
    """The watcher, counting its checks, so a test can wait for more checks after a notice."""

    def __init__(self, inner: OwnedFile) -> None:
        self.inner = inner
        self.interval_s = 0.001
        self.errors = 0
        self.checks = 0

    def instance_id(self) -> str | None:
        return self.inner.instance_id()

    def check(self) -> list[Notice]:
        found = self.inner.check()
        self.checks += 1
        return found


def test_owned_file_is_a_watcher_kind() -> None:
    assert "owned-file" in WATCHERS


def test_a_notice_file_appearing_mid_run_is_reported_once_with_its_power_off(
    tmp_path: Path,
) -> None:
    path = tmp_path / "notice.json"
    watcher = _Counting(OwnedFile(path.as_uri()))
    seen: list[Notice] = []
    stop = threading.Event()
    thread = threading.Thread(target=watch, args=(watcher, seen.append, stop), daemon=True)
    thread.start()
    try:
        wait_until(lambda: watcher.checks >= 3, what="checks with no file")
        assert seen == []
        _write(path, "2026-01-02T03:04:05Z")
        wait_until(lambda: seen, what="the drain notice")
        after = watcher.checks
        wait_until(lambda: watcher.checks >= after + 5, what="more checks of the same file")
    finally:
        stop.set()
        thread.join(5)
    assert len(seen) == 1
    notice = seen[0].to_data()
    assert (notice["source"], notice["action"]) == ("owned-file", "terminate")
    assert power_off_time(notice, NOTICED) == datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert watcher.inner.errors == 0


def test_a_rewritten_file_with_another_time_is_a_new_notice(tmp_path: Path) -> None:
    path = tmp_path / "notice.json"
    watcher = make_watcher("owned-file", path.as_uri())
    _write(path, "2026-01-02T03:04:05Z")
    first = watcher.check()
    assert len(first) == 1
    assert watcher.check() == []
    _write(path, "2026-01-02T03:10:00Z")
    second = watcher.check()
    assert len(second) == 1
    assert power_off_time(second[0].to_data(), NOTICED) == datetime(2026, 1, 2, 3, 10, tzinfo=UTC)
    assert watcher.check() == []


@pytest.mark.parametrize("body", ['{"action": "terminate", "time"', "[1, 2]", '{"time": "x"}'])
def test_a_malformed_file_is_an_error_not_a_notice(tmp_path: Path, body: str) -> None:
    path = tmp_path / "notice.json"
    path.write_text(body)
    watcher = OwnedFile(path.as_uri())
    assert watcher.check() == []
    assert watcher.errors == 1
    assert watcher.last_error is not None and str(path) in watcher.last_error


def test_an_unreadable_path_is_an_error_not_an_exception(tmp_path: Path) -> None:
    path = tmp_path / "notice.json"
    path.mkdir()  # a folder where the file should be: reading it fails
    watcher = OwnedFile(path.as_uri())
    assert watcher.check() == []
    assert watcher.errors == 1


def test_a_missing_file_is_no_notice_and_no_error(tmp_path: Path) -> None:
    watcher = OwnedFile((tmp_path / "absent" / "notice.json").as_uri())
    assert watcher.check() == []
    assert watcher.check() == []
    assert watcher.errors == 0


def test_instance_id_comes_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    watcher = OwnedFile((tmp_path / "n.json").as_uri())
    monkeypatch.delenv("GPUOPT_INSTANCE_ID", raising=False)
    assert watcher.instance_id() is None
    monkeypatch.setenv("GPUOPT_INSTANCE_ID", "ssh-gpu-box-1")
    assert watcher.instance_id() == "ssh-gpu-box-1"


@pytest.mark.parametrize(
    "url", ["http://169.254.169.254", "file://host/notice.json", "file:relative.json", "file:///"]
)
def test_a_url_that_names_no_local_file_is_refused(url: str) -> None:
    with pytest.raises(OwnedFileError, match="file"):
        OwnedFile(url)


def _env(url: str) -> dict[str, str]:
    return {
        "GPUOPT_DAEMON_URL": "http://127.0.0.1:1",
        "GPUOPT_AGENT_TOKEN": "t",
        "GPUOPT_ATTEMPT_KEY": "a",
        "GPUOPT_METADATA_KIND": "owned-file",
        "GPUOPT_METADATA_URL": url,
    }


def test_the_agent_config_accepts_a_file_url_for_owned_file_only(tmp_path: Path) -> None:
    url = (tmp_path / "notice.json").as_uri()
    assert AgentConfig.from_env(_env(url)).metadata_url == url
    with pytest.raises(AgentConfigError, match="GPUOPT_METADATA_URL"):
        AgentConfig.from_env(_env("http://169.254.169.254"))
