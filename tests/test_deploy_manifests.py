"""Static checks of the deployment files in deploy/ (issue 9).

Every YAML and JSON file is parsed; Helm templates (Go templates, not YAML) are checked
textually. `docker compose config`, `helm template`/`helm lint` and `systemd-analyze verify`
run only where those tools exist; otherwise those tests skip with the reason.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
CHART = DEPLOY / "helm" / "gpuopt"
TEMPLATES = CHART / "templates"
DASHBOARD = DEPLOY / "grafana" / "gpuopt-dashboard.json"
METRICS_SOURCE = ROOT / "optimizer" / "metrics.py"

# Enough for compose's ${VAR:?…} interpolation when `docker compose config` runs.
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
    assert set(services) >= {"gpuopt", "postgres"}
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


def test_compose_has_no_literal_secrets() -> None:
    env = _compose()["services"]["postgres"]["environment"]
    assert env["POSTGRES_PASSWORD"].startswith("${")


def _docker_compose_available() -> bool:
    if shutil.which("docker") is None:
        return False
    probe = subprocess.run(["docker", "compose", "version"], capture_output=True, check=False)
    return probe.returncode == 0


@pytest.mark.skipif(
    not _docker_compose_available(), reason="`docker compose` is not installed here"
)
def test_docker_compose_config(tmp_path: Path) -> None:
    result = subprocess.run(
        ["docker", "compose", "-f", str(DEPLOY / "compose.yaml"), "config", "--quiet"],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(tmp_path), **COMPOSE_ENV},
        check=False,
    )
    assert result.returncode == 0, result.stderr


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


# ---- Helm ----


def _values() -> dict:
    return yaml.safe_load((CHART / "values.yaml").read_text())


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
    text = (CHART / "values.yaml").read_text()
    replica_comment = text.split("replicaCount:")[0].rsplit("\n\n", 1)[-1]
    assert "PostgreSQL" in replica_comment and "leader election" in replica_comment


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


def _value_refs() -> set[str]:
    refs = set()
    for path in TEMPLATES.iterdir():
        refs.update(re.findall(r"\.Values\.([A-Za-z][\w.]*)", path.read_text()))
    return refs


def test_template_value_references_exist() -> None:
    values = _values()
    refs = _value_refs()
    assert refs
    missing = []
    for ref in sorted(refs):
        node = values
        for part in ref.split("."):
            if not isinstance(node, dict) or part not in node:
                missing.append(ref)
                break
            node = node[part]
    assert not missing, missing


def test_templates_textually() -> None:
    deployment = (TEMPLATES / "deployment.yaml").read_text()
    for needle in [
        "kind: Deployment",
        "replicas: {{ .Values.replicaCount }}",
        "GPUOPT_API__TOKEN",
        "GPUOPT_DATABASE_URL",
        "GPUOPT_DATA_DIR",
        "GPUOPT_POLICY_DIR",
        "secretKeyRef",
        "path: /healthz",
        "path: /readyz",
        "readOnly: true",
        '"0.0.0.0"',
    ]:
        assert needle in deployment, needle
    # Secrets are only ever referenced, never rendered from values.
    assert "kind: Secret" not in "".join(p.read_text() for p in TEMPLATES.iterdir())
    service = (TEMPLATES / "service.yaml").read_text()
    assert "kind: Service" in service and ".Values.service.port" in service
    policies = (TEMPLATES / "configmap-policies.yaml").read_text()
    assert "kind: ConfigMap" in policies and ".Values.policies.files" in policies
    monitor = (TEMPLATES / "servicemonitor.yaml").read_text()
    assert monitor.startswith("{{- if .Values.metrics.serviceMonitor.enabled }}")
    assert "kind: ServiceMonitor" in monitor and "path: /metrics" in monitor
    for path in TEMPLATES.iterdir():
        text = path.read_text()
        assert text.count("{{") == text.count("}}"), path.name
        opened = len(re.findall(r"{{-?\s*(?:if|range|with|define)\b", text))
        closed = len(re.findall(r"{{-?\s*end\s*-?}}", text))
        assert opened == closed, f"{path.name}: {opened} blocks opened, {closed} closed"


@pytest.mark.skipif(shutil.which("helm") is None, reason="helm is not installed here")
def test_helm_lint_and_template() -> None:
    for args in (
        ["helm", "lint", str(CHART)],
        ["helm", "template", "t", str(CHART), "--set", "metrics.serviceMonitor.enabled=true"],
    ):
        result = subprocess.run(args, capture_output=True, text=True, check=False)
        assert result.returncode == 0, result.stderr
    rendered = subprocess.run(
        ["helm", "template", "t", str(CHART)], capture_output=True, text=True, check=True
    ).stdout
    kinds = {d["kind"] for d in yaml.safe_load_all(rendered) if d}
    assert {"Deployment", "Service", "ConfigMap"} <= kinds


# ---- Grafana ----


def _source_metric_names() -> set[str]:
    return set(re.findall(r'"(gpuopt_[a-z_]+)"', METRICS_SOURCE.read_text()))


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


def test_dashboard_shape() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert "datasource" in variables


def test_the_chart_refuses_several_replicas_until_leader_election() -> None:
    text = (ROOT / "deploy" / "helm" / "gpuopt" / "templates" / "deployment.yaml").read_text()
    guard = text.split("apiVersion:")[0]
    assert "gt (int .Values.replicaCount) 1" in guard and "fail" in guard
