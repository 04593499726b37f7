"""The daemon config: embedded defaults, a YAML file with located errors, GPUOPT_* on top,
and `gpuopt config check|show`."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from optimizer.cli import app
from optimizer.daemon.config import DEFAULT_PORT, ConfigError, load_config, weak_token_problem

pytestmark = pytest.mark.usefixtures("daemon_env")

GOOD = """\
providers:
  aws:
    regions: [us-east-1, eu-west-1]
    spot_interval_s: 300
api:
  token: ${OPS_TOKEN}
alerts:
  channels:
    ops: {type: slack, url: "https://hooks.slack.com/services/T0/B0/abcdef"}
  routes:
    - {kinds: ["policy_*", "bid_cap_crossed"], min_severity: warning, channels: [ops]}
"""


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GPUOPT_DATA_DIR", str(tmp_path / "data"))
    return tmp_path / "data"


def test_no_config_means_the_embedded_default(data_dir: Path) -> None:
    config = load_config()
    assert config.source is None
    assert list(config.enabled_providers()) == ["local"]
    assert (config.api.host, config.api.port, config.api.token) == ("127.0.0.1", DEFAULT_PORT, None)
    assert config.effective_database_url == f"sqlite:///{data_dir / 'gpuopt.db'}"
    assert config.effective_policy_dir == data_dir / "policies"
    assert (config.loops.reconcile_s, config.loops.deliver_s, config.loops.watch_s) == (15, 5, 2)
    local = config.providers["local"]
    assert (local.spot_interval_s, local.on_demand_interval_s) == (600, 86_400)


def test_the_data_directorys_gpuopt_yaml_is_read_and_the_environment_wins(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data_dir.mkdir()
    (data_dir / "gpuopt.yaml").write_text(GOOD)
    monkeypatch.setenv("OPS_TOKEN", "from-the-file-via-env")
    monkeypatch.setenv("GPUOPT_API__PORT", "9001")
    monkeypatch.setenv("GPUOPT_PROVIDERS__AWS__SPOT_INTERVAL_S", "120")
    config = load_config()
    assert config.source == str(data_dir / "gpuopt.yaml")
    assert config.api.port == 9001
    assert config.api.token is not None
    assert config.api.token.get_secret_value() == "from-the-file-via-env"
    aws = config.providers["aws"]
    assert (aws.regions, aws.spot_interval_s) == (["us-east-1", "eu-west-1"], 120)
    assert "local" not in config.providers  # listing providers replaces the default
    assert config.alerts.routes[0].channels == ["ops"]
    assert "from-the-file-via-env" not in repr(config)


def test_file_problems_are_located_and_a_bad_variable_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("api:\n  port: 70000\n  hots: 0.0.0.0\nloops: {watch_s: -1}\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert [str(p) for p in caught.value.problems] == [
        f"{path}:2:9: api.port: must be <= 65535",
        f"{path}:3:3: api.hots: unknown field; did you mean 'host'?",
        f"{path}:4:18: loops.watch_s: must be > 0",
    ]
    path.write_text("api: {port: 9000}\n")
    monkeypatch.setenv("GPUOPT_LOOPS__WATCH_S", "often")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    [problem] = caught.value.problems
    assert str(problem).startswith("GPUOPT_LOOPS__WATCH_S: loops.watch_s: must be a valid number")


def test_config_check_exits_2_with_located_lines(tmp_path: Path) -> None:
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text("api: {port: 9000}\n")
    bad.write_text("providers:\n  azure: {}\n")
    runner = CliRunner()
    ok = runner.invoke(app, ["config", "check", str(good)])
    assert ok.exit_code == 0 and ok.stdout == f"{good}: ok\n"
    failed = runner.invoke(app, ["config", "check", str(bad)])
    assert failed.exit_code == 2
    assert failed.stderr.startswith(f"{bad}:2:3: providers: unknown provider 'azure'")


def test_config_check_refuses_a_public_address_without_a_token(tmp_path: Path) -> None:
    path = tmp_path / "public.yaml"
    path.write_text("api: {host: 0.0.0.0}\n")
    result = CliRunner().invoke(app, ["config", "check", str(path)])
    assert result.exit_code == 2
    # Located at the host that makes a token necessary.
    assert f"{path}:1:7: api.token: required to listen on 0.0.0.0" in result.stderr


def test_config_show_masks_every_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(GOOD)
    monkeypatch.setenv("OPS_TOKEN", "hidden-token-value")
    result = CliRunner().invoke(app, ["config", "show", str(path)])
    assert result.exit_code == 0, result.output
    assert "hidden-token-value" not in result.stdout and "abcdef" not in result.stdout
    assert "token: '**********'" in result.stdout


def test_the_leader_lease_must_outlast_two_checks_and_stay_under_the_session_timeout(
    tmp_path: Path,
) -> None:
    path = tmp_path / "leader.yaml"
    path.write_text("leader:\n  check_s: 3\n  lease_s: 6\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert [str(p) for p in caught.value.problems] == [
        f"{path}:3:12: leader.lease_s: must be more than twice leader.check_s (3)"
    ]
    path.write_text("leader: {lease_s: 11}\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert [str(p) for p in caught.value.problems] == [
        f"{path}:1:19: leader.lease_s: must be <= 10"
    ]
    path.write_text("leader: {check_s: 1, lease_s: 4}\n")
    leader = load_config(path).leader
    assert (leader.check_s, leader.lease_s) == (1, 4)


def test_the_agent_section_becomes_the_settings_the_job_reconciler_renders_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PROXY_PASSWORD", "s3cret-proxy")
    path = tmp_path / "agent.yaml"
    path.write_text(
        "agent:\n"
        "  install: {version: 0.4.1, index_url: 'https://pypi.internal/simple', extras: []}\n"
        "  images: {aws: ami-0abc, gcp: projects/p/global/images/family/f}\n"
        "  env: {HF_HOME: /data/hf}\n"
        "  proxy: {https: 'http://ops:${PROXY_PASSWORD}@proxy:3128', no_proxy: [10.0.0.1]}\n"
    )
    config = load_config(path)
    agent = config.agent.settings()
    assert agent.install.version == "0.4.1" and agent.install.extras == ()
    assert agent.install.index_url == "https://pypi.internal/simple"
    assert agent.image("aws") == "ami-0abc" and agent.image("local") is None
    assert agent.proxy.https == "http://ops:s3cret-proxy@proxy:3128"
    assert "s3cret-proxy" in "".join(config.secrets())
    assert "s3cret-proxy" not in repr(config)
    assert load_config(None).agent.settings().install.requirement() == "gpuopt[probes]"


def test_agent_section_problems_are_located(tmp_path: Path) -> None:
    path = tmp_path / "bad-agent.yaml"
    path.write_text(
        "agent:\n"
        "  install:\n"
        "    version: 0.4.1\n"
        "    wheel_url: https://files/gpuopt-0.4.1-py3-none-any.whl\n"
        "    venv: relative/dir\n"
        "  images: {local: img-1}\n"
        "  env: {GPUOPT_AGENT_TOKEN: x}\n"
        "  proxy: {http: 'socks5://p:1080'}\n"
    )
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert [str(p) for p in caught.value.problems] == [
        f"{path}:4:16: agent.install.wheel_url: give version or wheel_url, not both",
        f"{path}:5:11: agent.install.venv: must be an absolute path",
        f"{path}:6:11: agent.images: local: its instances run on this host and take no image",
        f"{path}:7:8: agent.env: GPUOPT_AGENT_TOKEN is set by the bootstrap; choose another name",
        f"{path}:8:17: agent.proxy.http: must be an http:// or https:// URL on one line",
    ]


def test_a_public_address_needs_a_token_of_at_least_32_characters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "public.yaml"
    path.write_text("api: {host: 0.0.0.0, token: abcde}\n")
    result = CliRunner().invoke(app, ["config", "check", str(path)])
    assert result.exit_code == 2
    assert (
        f"{path}:1:22: api.token: must be at least 32 characters to listen on 0.0.0.0 "
        "(a non-loopback address); this one has 5; make one with: python -c "
        '"import secrets; print(secrets.token_urlsafe(32))"'
    ) in result.stderr
    assert "abcde" not in result.stderr
    monkeypatch.setenv("GPUOPT_API__TOKEN", "x" * 31)
    result = CliRunner().invoke(app, ["config", "check", str(path)])
    assert result.exit_code == 2 and "GPUOPT_API__TOKEN: api.token: must be at least 32" in (
        result.stderr
    )
    monkeypatch.setenv("GPUOPT_API__TOKEN", MADE[0])
    assert CliRunner().invoke(app, ["config", "check", str(path)]).exit_code == 0
    path.write_text("api: {host: 127.0.0.1, token: abcde}\n")  # loopback: any token will do
    monkeypatch.delenv("GPUOPT_API__TOKEN")
    assert CliRunner().invoke(app, ["config", "check", str(path)]).exit_code == 0


# Made once by secrets.token_urlsafe(32), token_hex(32) and token_hex(16): test values only.
MADE = (
    "XnZd9WS_taWVxrtJwoFV-UpHqrALd8E4aIkAT2jErAs",
    "dc9b85fc8605a6374b09cad9fa321de64babd55e68940e3a48e62080598b6bfc",
    "c9db641f775c8c6d7a85347787ab4098",
)


@pytest.mark.parametrize(
    ("token", "why"),
    [
        ("a" * 32, "a run of 32 repeated or consecutive characters"),
        ("password" * 4, "a common word (8 characters); 24 characters repeated from earlier"),
        ("0123456789" * 4, "a run of 10 repeated or consecutive characters"),
    ],
)
def test_a_public_address_refuses_a_long_but_guessable_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, token: str, why: str
) -> None:
    path = tmp_path / "public.yaml"
    path.write_text(f"api: {{host: 0.0.0.0, token: '{token}'}}\n")
    result = CliRunner().invoke(app, ["config", "check", str(path)])
    assert result.exit_code == 2
    line = next(li for li in result.stderr.splitlines() if "api.token" in li)
    assert line.startswith(
        f"{path}:1:22: api.token: too easy to guess to listen on 0.0.0.0 (a non-loopback "
        "address): an estimated "
    )
    assert "bits, at least 128 needed (" in line and why in line
    assert line.endswith(
        'make one with: python -c "import secrets; print(secrets.token_urlsafe(32))"'
    )
    assert token[:8] not in result.stderr  # never echoed
    # The daemon refuses it the same way (where the variable set it, the variable is named).
    monkeypatch.setenv("GPUOPT_API__TOKEN", token)
    assert weak_token_problem(load_config(path)) == (
        f"GPUOPT_API__TOKEN: api.token: {line.split('api.token: ', 1)[1]}"
    )
    for made in MADE:
        monkeypatch.setenv("GPUOPT_API__TOKEN", made)
        assert weak_token_problem(load_config(path)) is None
        assert CliRunner().invoke(app, ["config", "check", str(path)]).exit_code == 0


def test_config_check_reports_every_problem_at_once_in_file_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One section's schema error used to hide the other sections' problems, the file's
    # problems hid the variables', and both hid what the daemon would refuse.
    path = tmp_path / "many.yaml"
    path.write_text(
        "api:\n"
        "  host: 0.0.0.0\n"  # the daemon would refuse: no token
        "  port: 70000\n"
        "providers:\n"
        "  local: {enabled: false}\n"  # the daemon would refuse: nothing to poll
        "loops: {watch_s: -1}\n"
        "agent:\n"
        "  env: {1bad: x}\n"
        "alerts: {channels: [ops]}\n"
    )
    monkeypatch.setenv("GPUOPT_LEADER__CHECK_S", "often")
    result = CliRunner().invoke(app, ["config", "check", str(path)])
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        f"{path}:2:3: api.token: required to listen on 0.0.0.0 (a non-loopback address); "
        "set it or GPUOPT_API__TOKEN",
        f"{path}:3:9: api.port: must be <= 65535",
        f"{path}:4:1: providers: no provider is enabled; nothing will be polled",
        f"{path}:6:18: loops.watch_s: must be > 0",
        f"{path}:8:8: agent.env: '1bad' is not an environment variable name",
        f"{path}:9:20: alerts.channels: must be a mapping; for example: channels: {{ops: "
        "{type: slack, url: 'https://hooks.slack.com/services/T0/B0/x'}}",
        "GPUOPT_LEADER__CHECK_S: leader.check_s: must be a valid number, unable to parse string "
        "as a number",
    ]
    # The daemon reads the config the same way: every schema and variable problem at once.
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert [p.field for p in caught.value.problems] == [
        "api.port",
        "loops.watch_s",
        "agent.env",
        "alerts.channels",
        "leader.check_s",
    ]


def test_config_check_does_not_report_a_bad_value_twice(tmp_path: Path) -> None:
    # A token that is not text is reported once: not again as "required" once set aside.
    path = tmp_path / "token.yaml"
    path.write_text("api: {host: 0.0.0.0, token: [a, b]}\n")
    result = CliRunner().invoke(app, ["config", "check", str(path)])
    assert result.exit_code == 2
    [line] = result.stderr.splitlines()
    assert line.startswith(f"{path}:1:29: api.token: ")
    assert "required" not in line


def test_the_logs_section_sets_the_cap_and_retention_and_its_problems_are_located(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert (load_config(None).logs.max_bytes_per_job, load_config(None).logs.retention_days) == (
        16 << 20,
        30,
    )
    path = tmp_path / "logs.yaml"
    path.write_text("logs:\n  max_bytes_per_job: 1048576\n  retention_days: 7\n")
    assert (load_config(path).logs.max_bytes_per_job, load_config(path).logs.retention_days) == (
        1 << 20,
        7,
    )
    path.write_text("logs:\n  max_bytes_per_job: 1000\n  retention_days: 0\n  keep: all\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert [str(p) for p in caught.value.problems] == [
        f"{path}:2:22: logs.max_bytes_per_job: must be >= 65536",
        f"{path}:3:19: logs.retention_days: must be > 0",
        f"{path}:4:3: logs.keep: unknown field",
    ]
    monkeypatch.setenv("GPUOPT_LOGS__RETENTION_DAYS", "forever")
    with pytest.raises(ConfigError) as caught:
        load_config(None)
    [problem] = caught.value.problems
    assert str(problem).startswith("GPUOPT_LOGS__RETENTION_DAYS: logs.retention_days: must be")


def test_the_telemetry_section_sets_both_retentions_and_says_when_they_are_out_of_order(
    tmp_path: Path,
) -> None:
    default = load_config(None).telemetry
    assert (default.minute_days, default.hourly_days) == (14, 400)
    path = tmp_path / "telemetry.yaml"
    path.write_text("telemetry:\n  minute_days: 2\n  hourly_days: 90\n")
    assert (load_config(path).telemetry.minute_days, load_config(path).telemetry.hourly_days) == (
        2,
        90,
    )
    path.write_text("telemetry:\n  minute_days: 30\n  hourly_days: 7\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    [problem] = caught.value.problems
    assert str(problem) == (
        f"{path}:3:16: telemetry.hourly_days: must be more than telemetry.minute_days (30)"
    )


def test_agent_events_are_kept_thirty_days_by_default_and_the_setting_is_checked(
    tmp_path: Path,
) -> None:
    assert load_config(None).agent_events.retention_days == 30
    path = tmp_path / "agent-events.yaml"
    path.write_text("agent_events:\n  retention_days: 7\n")
    assert load_config(path).agent_events.retention_days == 7
    path.write_text("agent_events:\n  retention_days: 0\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    [problem] = caught.value.problems
    assert str(problem).startswith(f"{path}:2:19: agent_events.retention_days: ")
