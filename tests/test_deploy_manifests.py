"""Static checks of the deployment files in deploy/ and docs/deploy.md.

Every YAML and JSON file is parsed; Helm templates (Go templates, not YAML) are checked
without helm: template syntax (tests/helpers/gotemplate_lint.py), values against the templates'
`.Values` references, and what the templates say. `docker compose config` (or
`docker-compose config`), `helm lint`/`helm template` and `systemd-analyze verify` run where
those tools exist; otherwise those tests skip with the reason.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.helpers import gotemplate_lint

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
CHART = DEPLOY / "helm" / "gpuopt"
TEMPLATES = CHART / "templates"
DASHBOARD = DEPLOY / "grafana" / "gpuopt-dashboard.json"
METRICS_SOURCE = ROOT / "optimizer" / "daemon" / "metrics.py"
# The cost ledger's series (spend, savings, overhead, budgets), exported by their collector.
COST_METRICS_SOURCE = ROOT / "optimizer" / "daemon" / "spend.py"

# Enough for compose's ${VAR:?…} interpolation when `compose config` runs.
COMPOSE_ENV = {"POSTGRES_PASSWORD": "test-password", "GPUOPT_API_TOKEN": "t" * 32}


def _plain_yaml_files() -> list[Path]:
    files = [*DEPLOY.rglob("*.yaml"), *DEPLOY.rglob("*.yml")]
    return sorted(p for p in files if TEMPLATES not in p.parents)


def _dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    lines: list[str] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        lines.append(pending + line)
        pending = ""
    out = []
    for line in lines:
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def _unit_options(path: Path) -> dict[str, dict[str, list[str]]]:
    sections: dict[str, dict[str, list[str]]] = {}
    current = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = line[1:-1]
            sections.setdefault(current, {})
            continue
        key, _, value = line.partition("=")
        sections[current].setdefault(key.strip(), []).append(value.strip())
    return sections


# ---- every file parses ----


@pytest.mark.parametrize("path", _plain_yaml_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_yaml_files_parse(path: Path) -> None:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    assert docs, f"{path} is empty"


@pytest.mark.parametrize(
    "path", sorted(DEPLOY.rglob("*.json")), ids=lambda p: str(p.relative_to(ROOT))
)
def test_json_files_parse(path: Path) -> None:
    json.loads(path.read_text())


def test_expected_files_exist() -> None:
    for rel in [
        "deploy/Dockerfile",
        "deploy/Dockerfile.agent",
        "deploy/compose.yaml",
        "deploy/systemd/gpuopt.service",
        "deploy/helm/gpuopt/Chart.yaml",
        "deploy/helm/gpuopt/values.yaml",
        "deploy/helm/gpuopt/templates/_helpers.tpl",
        "deploy/helm/gpuopt/templates/deployment.yaml",
        "deploy/helm/gpuopt/templates/service.yaml",
        "deploy/helm/gpuopt/templates/configmap-policies.yaml",
        "deploy/helm/gpuopt/templates/servicemonitor.yaml",
        "deploy/helm/gpuopt/templates/NOTES.txt",
        "deploy/grafana/gpuopt-dashboard.json",
        "docs/deploy.md",
    ]:
        assert (ROOT / rel).is_file(), rel


# ---- Dockerfiles ----


def test_daemon_dockerfile() -> None:
    path = DEPLOY / "Dockerfile"
    instr = _dockerfile_instructions(path)
    froms = [args for word, args in instr if word == "FROM"]
    args = {a.split("=", 1)[0]: a.split("=", 1)[1] for w, a in instr if w == "ARG" and "=" in a}
    images = [f.split()[0].replace("${PYTHON_IMAGE}", args.get("PYTHON_IMAGE", "")) for f in froms]
    assert images and all(i == "python:3.11-slim" for i in images), images
    users = [a for w, a in instr if w == "USER"]
    assert users, "no USER instruction"
    final_user = users[-1].split(":")[0]
    assert final_user not in ("root", "0"), final_user
    runs = " ".join(a for w, a in instr if w == "RUN")
    assert "torch" not in runs.replace("find_spec('torch')", ""), "the daemon image installs torch"
    assert "probes" not in runs, "the daemon image installs the probes extra"
    entry = json.loads(next(a for w, a in instr if w == "ENTRYPOINT"))
    assert entry == ["gpuopt", "daemon"]
    cmd = json.loads(next(a for w, a in instr if w == "CMD"))
    assert cmd[cmd.index("--host") + 1] == "0.0.0.0"
    assert "/healthz" in next(a for w, a in instr if w == "HEALTHCHECK")
    assert any(w == "VOLUME" and "/var/lib/gpuopt" in a for w, a in instr)
    env = " ".join(a for w, a in instr if w == "ENV")
    assert "GPUOPT_DATA_DIR=/var/lib/gpuopt" in env
    assert "GPUOPT_API__TOKEN" in path.read_text(), "say where the token comes from"


def test_agent_dockerfile() -> None:
    path = DEPLOY / "Dockerfile.agent"
    instr = _dockerfile_instructions(path)
    runs = " ".join(a for w, a in instr if w == "RUN")
    assert "[probes]" in runs
    assert any(w == "USER" and a.split(":")[0] not in ("root", "0") for w, a in instr)
    text = path.read_text().lower()
    assert "cpu" in text and "cuda" in text, "explain the torch CPU/CUDA choice"
    assert "download.pytorch.org/whl/cpu" in text


# ---- compose ----


def _compose() -> dict:
    return yaml.safe_load((DEPLOY / "compose.yaml").read_text())


def test_compose_services() -> None:
    compose = _compose()
    services = compose["services"]
    assert set(services) >= {"gpuopt", "postgres", "migrate"}
    for name in ("gpuopt", "postgres"):
        assert "test" in services[name]["healthcheck"], name
    pg = services["postgres"]
    assert pg["image"] == "postgres:16"
    pg_volume = pg["volumes"][0].split(":")[0]
    assert pg_volume in compose["volumes"], "postgres data must be a named volume"
    app = services["gpuopt"]
    assert app["depends_on"]["postgres"]["condition"] == "service_healthy"
    env = app["environment"]
    assert env["GPUOPT_DATABASE_URL"].startswith("postgresql://gpuopt:")
    assert env["GPUOPT_DATABASE_URL"].endswith("@postgres:5432/gpuopt")
    assert "${" in env["GPUOPT_API__TOKEN"], "the token must come from the environment"
    mounts = app["volumes"]
    assert any(m.endswith(":/etc/gpuopt/policies:ro") for m in mounts), "policies read-only"
    assert env["GPUOPT_POLICY_DIR"] == "/etc/gpuopt/policies"
    data = next(m for m in mounts if m.split(":")[1] == env["GPUOPT_DATA_DIR"])
    assert data.split(":")[0] in compose["volumes"]
    assert app["build"]["dockerfile"] == "deploy/Dockerfile"


def test_compose_gives_the_daemon_room_for_its_connection_cap() -> None:
    """Every API connection holds a descriptor; the daemon keeps api.max_connections
    RESERVED_FDS under the soft limit, so the limit must leave the default cap whole."""
    from optimizer.daemon.config import ApiConfig
    from optimizer.daemon.connections import RESERVED_FDS

    nofile = _compose()["services"]["gpuopt"]["ulimits"]["nofile"]
    default_cap = ApiConfig().max_connections
    assert int(nofile["soft"]) >= default_cap + RESERVED_FDS
    assert int(nofile["hard"]) >= int(nofile["soft"])


def test_compose_daemon_starts_after_a_one_shot_migration() -> None:
    services = _compose()["services"]
    migrate, app = services["migrate"], services["gpuopt"]
    assert app["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert migrate["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert [*migrate["entrypoint"], *migrate["command"]] == ["gpuopt", "db", "upgrade"]
    assert migrate["restart"] == "no", "a one-shot must not be restarted"
    # The same image and the same database as the daemon.
    assert migrate["image"] == app["image"] and migrate["build"] == app["build"]
    url = app["environment"]["GPUOPT_DATABASE_URL"]
    assert migrate["environment"]["GPUOPT_DATABASE_URL"] == url
    assert migrate["env_file"] == app["env_file"]
    data = migrate["environment"]["GPUOPT_DATA_DIR"]
    assert any(m.endswith(f":{data}") for m in migrate["volumes"]), "no anonymous volume"


def test_compose_scales_to_several_replicas() -> None:
    """`--scale gpuopt=2` needs no fixed container name and a host port per replica."""
    compose = _compose()
    app = compose["services"]["gpuopt"]
    assert "container_name" not in app
    (port,) = app["ports"]
    assert port.endswith(":8470") and "${GPUOPT_PORTS:-8470}" in port
    text = (DEPLOY / "compose.yaml").read_text()
    assert "--scale gpuopt=2" in text and "GPUOPT_PORTS=8470-8471" in text


def test_compose_stays_within_what_compose_1_29_accepts() -> None:
    """Debian 12's docker-compose (1.29) validates the file in CI; Compose v2 reads it too."""
    compose = _compose()
    assert "name" not in compose, "docker-compose 1.29 rejects a top-level name"
    assert "version" not in compose, "Compose v2 warns about the obsolete version key"
    for name, service in compose["services"].items():
        env_files = service.get("env_file", [])
        assert all(isinstance(f, str) for f in env_files), f"{name}: env_file as plain paths"


def test_compose_has_no_literal_secrets() -> None:
    services = _compose()["services"]
    assert services["postgres"]["environment"]["POSTGRES_PASSWORD"].startswith("${")
    for name in ("gpuopt", "migrate"):
        url = services[name]["environment"]["GPUOPT_DATABASE_URL"]
        assert ":${POSTGRES_PASSWORD" in url, name


@functools.cache
def _compose_command() -> tuple[str, ...] | None:
    """Compose v2 (`docker compose`) where installed, else a `docker-compose` binary."""
    if shutil.which("docker"):
        probe = subprocess.run(["docker", "compose", "version"], capture_output=True, check=False)
        if probe.returncode == 0:
            return ("docker", "compose")
    if shutil.which("docker-compose"):
        return ("docker-compose",)
    return None


def _compose_config(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    """`compose config` of deploy/compose.yaml, with an empty .env in a scratch project
    directory: the environment here is all it interpolates, and no .env is created in deploy/."""
    command = _compose_command()
    if command is None:
        pytest.skip("neither `docker compose` nor `docker-compose` is installed here")
    project = tmp_path / "project"
    project.mkdir(exist_ok=True)
    (project / ".env").write_text("")
    compose_file = str(DEPLOY / "compose.yaml")
    return subprocess.run(
        [*command, "-f", compose_file, "--project-directory", str(project), "config", *args],
        capture_output=True,
        text=True,
        env={"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), **COMPOSE_ENV, **env},
        check=False,
    )


def test_docker_compose_config(tmp_path: Path) -> None:
    result = _compose_config(tmp_path, "--quiet")
    assert result.returncode == 0, result.stderr


def test_docker_compose_resolves_the_migration_and_replica_ports(tmp_path: Path) -> None:
    result = _compose_config(tmp_path, GPUOPT_PORTS="8470-8471")
    assert result.returncode == 0, result.stderr
    services = yaml.safe_load(result.stdout)["services"]
    depends = services["gpuopt"]["depends_on"]
    assert depends["migrate"]["condition"] == "service_completed_successfully"
    assert services["migrate"]["command"] == ["db", "upgrade"]
    # v1 prints "127.0.0.1:8470-8471:8470/tcp", v2 a mapping with published: 8470-8471.
    assert "8470-8471" in json.dumps(services["gpuopt"]["ports"])


def test_docker_compose_refuses_a_missing_secret(tmp_path: Path) -> None:
    result = _compose_config(tmp_path, "--quiet", POSTGRES_PASSWORD="")
    assert result.returncode != 0
    assert "POSTGRES_PASSWORD" in result.stderr


# ---- systemd ----


def test_systemd_unit() -> None:
    unit = _unit_options(DEPLOY / "systemd" / "gpuopt.service")
    svc = unit["Service"]
    expected = {
        "Restart": "on-failure",
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
    }
    for key, value in expected.items():
        assert svc.get(key) == [value], key
    assert svc["User"][0] not in ("root", "0")
    assert any("/var/lib/gpuopt" in v for v in svc["ReadWritePaths"])
    assert "GPUOPT_DATA_DIR=/var/lib/gpuopt" in svc["Environment"]
    assert svc["EnvironmentFile"]
    assert int(svc["TimeoutStopSec"][0]) > 0
    assert " daemon" in svc["ExecStart"][0]
    assert unit["Install"]["WantedBy"] == ["multi-user.target"]


def test_systemd_unit_gives_the_daemon_room_for_its_connection_cap() -> None:
    from optimizer.daemon.config import ApiConfig
    from optimizer.daemon.connections import RESERVED_FDS

    (limit,) = _unit_options(DEPLOY / "systemd" / "gpuopt.service")["Service"]["LimitNOFILE"]
    assert int(limit) >= ApiConfig().max_connections + RESERVED_FDS


def test_chart_says_how_the_daemon_gets_its_open_file_limit() -> None:
    """Kubernetes has no ulimit field: the values say what the daemon does instead."""
    values = (CHART / "values.yaml").read_text()
    assert "open-file limit" in values and "api.max_connections" in values


def test_systemd_unit_migrates_before_the_daemon_starts() -> None:
    svc = _unit_options(DEPLOY / "systemd" / "gpuopt.service")["Service"]
    (pre,) = svc["ExecStartPre"]
    assert pre.endswith("gpuopt db upgrade")
    assert pre.split()[0] == svc["ExecStart"][0].split()[0], "the same gpuopt install"
    # Both read the config through the environment, so both open the same database.
    assert "GPUOPT_CONFIG=/etc/gpuopt/gpuopt.yaml" in svc["Environment"]
    assert "--config" not in svc["ExecStart"][0]
    assert svc["TimeoutStartSec"], "a long migration needs more than the default 90 s"


def test_systemd_unit_explains_the_single_instance_sqlite_lock() -> None:
    text = (DEPLOY / "systemd" / "gpuopt.service").read_text()
    assert "One instance per database with SQLite" in text
    assert "PostgreSQL" in text and "leader" in text


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze here")
def test_systemd_analyze_verify() -> None:
    result = subprocess.run(
        ["systemd-analyze", "verify", str(DEPLOY / "systemd" / "gpuopt.service")],
        capture_output=True,
        text=True,
        check=False,
    )
    # The ExecStart binary is not installed on a test machine; anything else is a real error.
    problems = [
        line
        for line in (result.stdout + result.stderr).splitlines()
        if line.strip() and "is not executable" not in line and "gpuopt.service" in line
    ]
    assert not problems, problems


# ---- Helm: values ----


def _values() -> dict:
    return yaml.safe_load((CHART / "values.yaml").read_text())


def _template(name: str) -> str:
    return (TEMPLATES / name).read_text()


def _all_templates() -> str:
    return "".join(p.read_text() for p in sorted(TEMPLATES.iterdir()))


def _lookup(values: dict, path: str) -> bool:
    node: object = values
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def _documented_value_paths() -> list[str]:
    """Dotted paths of the keys in values.yaml whose comment starts with `# --`."""
    key_line = re.compile(r"^(\s*)([A-Za-z][\w-]*):(\s|$)")
    stack: list[tuple[int, str]] = []
    comment: list[str] = []
    paths = []
    for line in (CHART / "values.yaml").read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            comment.append(stripped)
            continue
        match = key_line.match(line)
        if match:
            indent = len(match.group(1))
            while stack and stack[-1][0] >= indent:
                stack.pop()
            stack.append((indent, match.group(2)))
            if comment and comment[0].startswith("# --"):
                paths.append(".".join(key for _, key in stack))
        comment = []
    return paths


def _value_refs() -> set[str]:
    return set(re.findall(r"\.Values\.([A-Za-z][\w]*(?:\.[A-Za-z]\w*)*)", _all_templates()))


def test_chart_metadata() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2"
    assert chart["name"] == "gpuopt"
    assert chart["version"] and chart["appVersion"]


def test_values_defaults() -> None:
    values = _values()
    assert values["replicaCount"] == 1
    assert values["metrics"]["serviceMonitor"]["enabled"] is False
    assert values["apiToken"]["existingSecret"]
    assert values["database"]["existingSecret"] == ""
    assert values["podSecurityContext"]["runAsNonRoot"] is True
    assert values["migrations"]["enabled"] is True
    assert values["podDisruptionBudget"]["maxUnavailable"] == 1
    text = (CHART / "values.yaml").read_text()
    replica_comment = text.split("replicaCount:")[0].rsplit("\n\n", 1)[-1]
    assert "PostgreSQL" in replica_comment and "leader" in replica_comment
    assert "SQLite" in replica_comment


def test_values_documented() -> None:
    """Every key in values.yaml has a comment on the line above it or at its end."""
    lines = (CHART / "values.yaml").read_text().splitlines()
    key_line = re.compile(r"^\s*([A-Za-z][\w-]*):(\s|$)")
    undocumented = []
    for i, line in enumerate(lines):
        if not key_line.match(line) or line.lstrip().startswith("#"):
            continue
        before = lines[i - 1].strip() if i else ""
        if "#" in line or before.startswith("#"):
            continue
        # A section header is documented by the comments of the keys under it.
        if line.rstrip().endswith(":") and i + 1 < len(lines):
            nxt = lines[i + 1]
            if nxt.strip().startswith("#") or key_line.match(nxt):
                continue
        undocumented.append(line.strip())
    assert not undocumented, undocumented


def test_template_value_references_exist() -> None:
    values = _values()
    refs = _value_refs()
    assert {"replicaCount", "database.existingSecret", "migrations.enabled"} <= refs
    missing = sorted(ref for ref in refs if not _lookup(values, ref))
    assert not missing, f"templates read values that values.yaml lacks: {missing}"


def test_every_documented_value_is_used() -> None:
    """A value the templates never read would be documented but do nothing."""
    refs = _value_refs()
    paths = _documented_value_paths()
    assert "podDisruptionBudget.maxUnavailable" in paths
    unused = [
        path
        for path in paths
        if not any(
            ref == path or path.startswith(ref + ".") or ref.startswith(path + ".") for ref in refs
        )
    ]
    assert not unused, f"values no template reads: {unused}"


# ---- Helm: template syntax ----


@pytest.mark.parametrize("name", sorted(p.name for p in TEMPLATES.iterdir()))
def test_template_syntax(name: str) -> None:
    assert gotemplate_lint.problems(name, _template(name)) == []


def test_included_templates_are_defined() -> None:
    defined = gotemplate_lint.defined_templates(_template("_helpers.tpl"))
    included = gotemplate_lint.included_templates(_all_templates())
    assert {"gpuopt.storeEnv", "gpuopt.postgres"} <= included
    assert included <= defined, f"included but never defined: {included - defined}"


@pytest.mark.parametrize(
    ("broken", "expected"),
    [
        ("{{- if .Values.a }}\nx: 1\n", "if is never closed"),
        ("x: 1\n{{- end }}\n", "end without an open block"),
        ("{{ else }}\n", "else outside"),
        ("{{ .Values.a | nindnet 4 }}\n", "unknown function 'nindnet'"),
        ("{{-.Values.a }}\n", "must be followed by a space"),
        ('{{ default (printf "%s" .Values.a }}\n', "'(' without ')'"),
        ("{{ .Values.a }\n", "do not pair up"),
    ],
)
def test_template_lint_catches(broken: str, expected: str) -> None:
    found = gotemplate_lint.problems("t.yaml", broken)
    assert any(expected in problem for problem in found), found


# ---- Helm: what the chart renders ----


def _helper(name: str) -> str:
    """The body of `{{- define "name" }}` in _helpers.tpl, up to the next definition."""
    text = _template("_helpers.tpl")
    return text.split(f'define "{name}"', 1)[1].split("{{- define", 1)[0].split("{{/*", 1)[0]


def _block(text: str, start: str) -> str:
    """A YAML block of a template: the line that starts with `start` (indentation aside) and
    the lines after it that are indented deeper."""
    lines = text.splitlines()
    first = next(i for i, line in enumerate(lines) if line.strip().startswith(start))
    indent = len(lines[first]) - len(lines[first].lstrip())
    out = [lines[first]]
    for line in lines[first + 1 :]:
        if line.strip() and len(line) - len(line.lstrip()) <= indent:
            break
        out.append(line)
    return "\n".join(out)


def test_chart_allows_several_replicas_only_with_postgresql() -> None:
    deployment = _template("deployment.yaml")
    guard = deployment.split("apiVersion:")[0]
    assert 'if and (gt (int .Values.replicaCount) 1) (not (include "gpuopt.postgres" .))' in guard
    assert "fail" in guard and "database.existingSecret" in guard and "SQLite" in guard
    assert "if .Values.database.existingSecret" in _helper("gpuopt.postgres")
    assert "replicas: {{ .Values.replicaCount }}" in deployment


def test_chart_rolls_postgresql_replicas_and_recreates_a_sqlite_pod() -> None:
    deployment = _template("deployment.yaml")
    strategy = deployment.split('{{- if include "gpuopt.postgres" . }}', 1)[1]
    rolling, recreate = strategy.split("  selector:", 1)[0].split("{{- else }}")
    assert "type: RollingUpdate" in rolling and "maxUnavailable: 0" in rolling
    assert "type: Recreate" in recreate


def test_chart_has_a_disruption_budget_with_several_replicas() -> None:
    pdb = _template("pdb.yaml")
    assert pdb.startswith("{{- if gt (int .Values.replicaCount) 1 }}")
    assert pdb.rstrip().endswith("{{- end }}")
    plain = [line for line in pdb.splitlines() if not re.fullmatch(r"\s*{{.*}}", line)]
    manifest = yaml.safe_load(re.sub(r"{{.*?}}", "x", "\n".join(plain)))
    assert manifest["apiVersion"] == "policy/v1" and manifest["kind"] == "PodDisruptionBudget"
    assert "maxUnavailable: {{ .Values.podDisruptionBudget.maxUnavailable }}" in pdb
    assert 'include "gpuopt.selectorLabels"' in _block(pdb, "selector:")


def test_chart_migrates_in_an_init_container_with_the_daemons_database() -> None:
    deployment = _template("deployment.yaml")
    init = _block(deployment, "initContainers:")
    containers = _block(deployment, "containers:")
    assert 'command: ["gpuopt", "db", "upgrade"]' in init
    assert "Helm hook" in deployment.split("initContainers:")[0], "say why not a hook Job"
    assert deployment.count('include "gpuopt.image" .') == 2, "the daemon's image"
    for part in (init, containers):
        assert 'include "gpuopt.storeEnv" .' in part
        assert 'include "gpuopt.storeMounts" .' in part
        assert ".Values.extraEnv" in part and ".Values.extraEnvFrom" in part
    store_env = _helper("gpuopt.storeEnv")
    for needle in ("GPUOPT_DATABASE_URL", "secretKeyRef", "GPUOPT_DATA_DIR", "GPUOPT_CONFIG"):
        assert needle in store_env, needle
    assert "mountPath: /var/lib/gpuopt" in _helper("gpuopt.storeMounts")
    assert "{{- if .Values.migrations.enabled }}" in deployment


def test_chart_probes() -> None:
    deployment = _template("deployment.yaml")
    assert "path: /healthz" in _block(deployment, "livenessProbe:")
    assert "path: /healthz" in _block(deployment, "startupProbe:")
    assert "path: /readyz" in _block(deployment, "readinessProbe:")


def test_chart_service_routes_to_every_replica() -> None:
    service = _template("service.yaml")
    selector = _block(service, "selector:")
    assert [line.strip() for line in selector.splitlines()[1:]] == [
        '{{- include "gpuopt.selectorLabels" . | nindent 4 }}'
    ], "no role label: followers serve the API too"
    assert "kind: Service" in service and ".Values.service.port" in service


def test_chart_public_url_defaults_to_the_service() -> None:
    helper = _helper("gpuopt.publicUrl")
    assert '"http://%s.%s.svc:%v"' in helper and ".Values.publicUrl" in helper
    env = _block(_template("deployment.yaml"), "- name: GPUOPT_API__PUBLIC_URL")
    assert 'include "gpuopt.publicUrl" .' in env


def test_chart_keeps_a_volume_only_for_sqlite() -> None:
    assert '(not (include "gpuopt.postgres" .))' in _template("pvc.yaml").splitlines()[1]
    data = _block(_template("deployment.yaml"), "- name: data")
    assert 'if and .Values.persistence.enabled (not (include "gpuopt.postgres" .))' in data


def test_templates_textually() -> None:
    deployment = _template("deployment.yaml")
    for needle in [
        "kind: Deployment",
        "GPUOPT_API__TOKEN",
        "GPUOPT_POLICY_DIR",
        "secretKeyRef",
        "readOnly: true",
        '"0.0.0.0"',
    ]:
        assert needle in deployment, needle
    # Secrets are only ever referenced, never rendered from values.
    assert "kind: Secret" not in _all_templates()
    policies = _template("configmap-policies.yaml")
    assert "kind: ConfigMap" in policies and ".Values.policies.files" in policies
    monitor = _template("servicemonitor.yaml")
    assert monitor.startswith("{{- if .Values.metrics.serviceMonitor.enabled }}")
    assert "kind: ServiceMonitor" in monitor and "path: /metrics" in monitor


# ---- Helm: rendered by helm itself, where installed ----


def _helm(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["helm", *args], capture_output=True, text=True, check=False)


def _rendered(*sets: str) -> list[dict]:
    args = [arg for s in sets for arg in ("--set", s)]
    result = _helm("template", "t", str(CHART), *args)
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


needs_helm = pytest.mark.skipif(
    shutil.which("helm") is None,
    reason="helm is not installed here (no Debian 12 or official PyPI package)",
)


@needs_helm
def test_helm_lint() -> None:
    result = _helm("lint", str(CHART))
    assert result.returncode == 0, result.stdout + result.stderr


@needs_helm
def test_helm_template_sqlite() -> None:
    docs = _rendered("metrics.serviceMonitor.enabled=true")
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "Service", "ConfigMap", "PersistentVolumeClaim"} <= kinds
    assert "PodDisruptionBudget" not in kinds
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    assert deployment["spec"]["strategy"]["type"] == "Recreate"


@needs_helm
def test_helm_template_postgresql_replicas() -> None:
    docs = _rendered("replicaCount=3", "database.existingSecret=gpuopt-db")
    kinds = {d["kind"] for d in docs}
    assert "PodDisruptionBudget" in kinds and "PersistentVolumeClaim" not in kinds
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    assert deployment["spec"]["replicas"] == 3
    pod = deployment["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    assert init["command"] == ["gpuopt", "db", "upgrade"]
    init_env = {e["name"]: e for e in init["env"]}
    daemon_env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert init_env["GPUOPT_DATABASE_URL"] == daemon_env["GPUOPT_DATABASE_URL"]
    assert daemon_env["GPUOPT_API__PUBLIC_URL"]["value"] == "http://t-gpuopt.default.svc:8470"


@needs_helm
def test_helm_template_refuses_sqlite_replicas() -> None:
    result = _helm("template", "t", str(CHART), "--set", "replicaCount=2")
    assert result.returncode != 0
    assert "replicaCount > 1 needs PostgreSQL" in result.stderr


# ---- docs ----


def test_deploy_doc_covers_upgrades_and_high_availability() -> None:
    text = (ROOT / "docs" / "deploy.md").read_text()
    headings = re.findall(r"^## (.+)$", text, re.MULTILINE)
    for heading in ("1. pip + systemd", "2. Docker Compose", "3. Kubernetes", "Upgrades"):
        assert any(h.startswith(heading) for h in headings), heading
    assert "High availability" in headings  # docs/daemon.md links to it by name
    upgrades = text.split("## Upgrades")[1].split("\n## ")[0]
    assert "gpuopt db upgrade" in upgrades and "**older**" in upgrades and "**newer**" in upgrades
    ha = text.split("## High availability")[1].split("\n## ")[0]
    for needle in ("advisory lock", "15 s", "gpuopt_leader", "SQLite is single-instance"):
        assert needle in ha, needle
    for needle in ("deploy/aws-iam-policy.json", "deploy/gcp-roles.md"):
        assert needle in text, needle


def test_deploy_doc_names_only_values_the_chart_has() -> None:
    """Dotted value paths in the Helm section (`persistence.*`, `database.existingSecret`)."""
    values = _values()
    helm_section = (ROOT / "docs" / "deploy.md").read_text().split("## 3. Kubernetes")[1]
    helm_section = re.sub(r"```.*?```", "", helm_section.split("\n## ")[0], flags=re.DOTALL)
    named = set()
    for quoted in re.findall(r"`([^`]+)`", helm_section):
        for path in re.findall(r"\b([a-z][A-Za-z]*(?:\.[A-Za-z*]+)*)", quoted):
            if path.split(".")[0] in values:
                named.add(path.removesuffix(".*"))
    assert {"replicaCount", "migrations.enabled", "podDisruptionBudget.maxUnavailable"} <= named
    missing = sorted(path for path in named if not _lookup(values, path))
    assert not missing, f"docs/deploy.md names values the chart lacks: {missing}"


# ---- Grafana ----


def _source_metric_names() -> set[str]:
    text = METRICS_SOURCE.read_text() + COST_METRICS_SOURCE.read_text()
    return set(re.findall(r'"(gpuopt_[a-z_]+)"', text))


def _dashboard_exprs() -> list[str]:
    exprs: list[str] = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("expr"), str):
                exprs.append(node["expr"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(json.loads(DASHBOARD.read_text()))
    return exprs


def _base_name(series: str, known: set[str]) -> str:
    if series in known:
        return series
    for suffix in ("_total", "_bucket", "_count", "_sum", "_created"):
        if series.endswith(suffix) and series.removesuffix(suffix) in known:
            return series.removesuffix(suffix)
    return series


def test_dashboard_metrics_exist() -> None:
    known = _source_metric_names()
    assert "gpuopt_loop_duration_seconds" in known  # the regex still finds the names
    exprs = _dashboard_exprs()
    assert exprs
    used = {_base_name(s, known) for e in exprs for s in re.findall(r"gpuopt_[a-z_]+", e)}
    unknown = used - known
    assert not unknown, f"dashboard queries metrics the daemon does not export: {unknown}"
    unused = known - used
    assert not unused, f"metrics without a dashboard panel: {unused}"


def test_dashboard_counters_use_total_suffix() -> None:
    """prometheus_client exports a Counter named X as X_total."""
    source = METRICS_SOURCE.read_text()
    counters = set(re.findall(r'Counter\(\s*"(gpuopt_[a-z_]+)"', source))
    assert counters
    for expr in _dashboard_exprs():
        for name in re.findall(r"gpuopt_[a-z_]+", expr):
            assert name not in counters, f"{name} is exported as {name}_total: {expr}"


def test_the_dashboard_has_money_on_it() -> None:
    """Spend, savings, overhead and budget panels over the cost series the daemon exports."""
    dashboard = json.loads(DASHBOARD.read_text())
    titles = {p["title"]: p for p in dashboard["panels"]}
    for title, series in (
        ("Spend", "gpuopt_spend_usd_total"),
        ("Savings vs on-demand", "gpuopt_savings_usd_total"),
        ("Overhead", "gpuopt_overhead_usd_total"),
        ("Budget used (projected), by policy", "gpuopt_budget_used_ratio"),
    ):
        exprs = [t["expr"] for t in titles[title]["targets"]]
        assert any(series in e for e in exprs), (title, exprs)
    assert titles["Spend"]["fieldConfig"]["defaults"]["unit"] == "currencyUSD"


def test_dashboard_shape() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert "datasource" in variables


# ---- pinned dependencies ----

CONSTRAINTS = DEPLOY / "constraints.txt"


def _pins() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in CONSTRAINTS.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, sep, version = line.partition("==")
            assert sep and version, f"{CONSTRAINTS.name}: {line!r} is not pinned with =="
            pins[re.sub(r"[-_.]+", "-", name.split("[")[0]).lower()] = version
    return pins


def _requirement_name(requirement: str) -> str:
    return re.sub(r"[-_.]+", "-", re.split(r"[\[<>=!~; ]", requirement, maxsplit=1)[0]).lower()


def test_images_install_the_pinned_dependency_set() -> None:
    for name in ("Dockerfile", "Dockerfile.agent"):
        instr = _dockerfile_instructions(DEPLOY / name)
        copies = [a for w, a in instr if w == "COPY" and "deploy/constraints.txt" in a]
        assert copies, f"{name} does not copy deploy/constraints.txt"
        target = copies[0].split()[-1]
        installs = [a for w, a in instr if w == "RUN" and "pip install" in a and "/wheels" in a]
        assert installs, f"{name}: no pip install of the built wheel"
        for run in installs:
            assert f"--constraint {target}" in run, f"{name} installs without the pins: {run}"


def test_constraints_pin_every_runtime_dependency_but_no_gpu_stack() -> None:
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = _pins()
    for requirement in project["dependencies"]:
        assert "==" not in requirement, f"pyproject.toml keeps ranges: {requirement}"
        assert _requirement_name(requirement) in pins, f"{requirement} is not pinned"
    assert not {n for n in pins if n == "torch" or n.startswith("nvidia")}, "no torch/CUDA pins"


def test_security_policy_covers_the_threat_model_reporting_and_defaults() -> None:
    text = (ROOT / "SECURITY.md").read_text()
    for heading in (
        "## Reporting a vulnerability",
        "## Threat model",
        "### Who can reach the API",
        "### What an agent token allows",
        "### What a policy author can do",
        "### Where secrets live",
        "## Hardening defaults",
    ):
        assert heading in text, heading
    assert "deploy/constraints.txt" in text and CONSTRAINTS.is_file()
