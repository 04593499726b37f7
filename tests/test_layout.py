"""The package map's import rules (docs/extending.md has the map in words).

Every module of `optimizer/`, `providers/` and `policies/` belongs to one layer, and a layer
imports only the layers listed for it in `MAY_IMPORT` (and itself). Dependencies run one way:

    cli -> ui -> api -> daemon -> jobs, alerts -> store -> vocabulary -> common
    jobs -> policies, providers -> vocabulary;  agent -> probes -> vocabulary

Imports are read from the source (every `import`, also inside functions and under
TYPE_CHECKING), so a lazy import does not hide a back edge. Beyond the table: the layers'
graph has no cycle, and no package has modules that import each other in a circle.

Packages have faces: another layer imports a package's public modules only, never its
internals (`INTERNAL_MODULES`: the store's SQLModel tables and its engine), and no module
imports a `_private` name from another module, nor a `_private` module from outside the
package that holds it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOP_LEVEL = ("optimizer", "providers", "policies")
# The vocabulary: top-level modules of optimizer/ that every layer may use.
VOCABULARY = frozenset(
    {
        "model",
        "hardware",
        "catalog",
        "clock",
        "offers",
        "lifecycle",
        "protocol",
        "answers",
        "progress",
        "standby",
    }
)

VOCAB, COMMON, VERSION = "vocabulary", "optimizer.common", "optimizer"
BASE = frozenset({VOCAB, COMMON, VERSION})  # what any layer but common and the vocabulary uses
MAY_IMPORT: dict[str, frozenset[str]] = {
    COMMON: frozenset(),  # neutral helpers: nothing of gpuopt beyond themselves
    VERSION: frozenset(),  # optimizer/__init__.py: the version only
    VOCAB: frozenset({COMMON}),
    "providers": BASE,
    # owned machines: priced by the TCO model `gpuopt tco` uses, placed by the region table
    # (the one provider whose prices are computed, not quoted)
    "providers.ssh": BASE | {"providers", "optimizer.costs", "policies"},
    "policies": BASE,
    "optimizer.probes": BASE,
    # object storage (s3://, gs://, file://) behind one small interface
    "optimizer.storage": BASE,
    # the checkpoint convention, its upload and restore, through an object store
    "optimizer.checkpoints": BASE | {"optimizer.storage"},
    # code archives: packing, unpacking, and the daemon's keeping of them (in a bucket
    # through the object storage layer, imported only then)
    "optimizer.code": BASE | {"optimizer.storage"},
    "optimizer.agent": BASE
    | {"optimizer.probes", "optimizer.checkpoints", "optimizer.storage", "optimizer.code"},
    "optimizer.store": BASE,
    # the ledger's pure model; each provider's billing rule and FOCUS names from its registry
    # entry; the data-transfer and storage rates beside the ranking that prices a move with them
    "optimizer.costs": BASE | {"providers", "policies"},
    # alerts word the cost summary with the ledger's pure figures
    "optimizer.alerts": BASE | {"optimizer.store", "optimizer.costs"},
    # jobs record their events through the store, not through alerts
    "optimizer.jobs": BASE
    | {"optimizer.store", "optimizer.storage", "optimizer.costs", "policies", "providers"},
    "optimizer.daemon": BASE
    | {
        "optimizer.jobs",
        "optimizer.alerts",
        "optimizer.store",
        "optimizer.costs",
        "policies",
        "providers",
    },
    "optimizer.api": BASE
    | {
        "optimizer.code",
        "optimizer.daemon",
        "optimizer.jobs",
        "optimizer.alerts",
        "optimizer.store",
        "optimizer.costs",
        "policies",
        "providers",
    },
    # the web console: a face built on the API (its app, state and views)
    "optimizer.ui": BASE
    | {
        "optimizer.api",
        "optimizer.daemon",
        "optimizer.jobs",
        "optimizer.alerts",
        "optimizer.store",
        "optimizer.costs",
        "policies",
        "providers",
    },
    "optimizer.cli": BASE
    | {
        "optimizer.ui",  # only to hand the API and console to the daemon it starts
        "optimizer.api",  # only to hand the API to the daemon it starts
        "optimizer.daemon",
        "optimizer.jobs",
        "optimizer.alerts",
        "optimizer.store",
        "optimizer.costs",
        "optimizer.agent",
        "optimizer.probes",
        "optimizer.checkpoints",
        "optimizer.storage",
        "optimizer.code",
        "policies",
        "providers",
    },
}
# Modules that are their package's inside: only their own package imports them (the package's
# `__init__` exports what other layers use).
INTERNAL_MODULES = frozenset({"optimizer.store.tables", "optimizer.store.engine"})
# Imports the faces rule lets through, each with why (remove a line when its reason is gone).
FACE_EXCEPTIONS: dict[tuple[str, str], str] = {}
# Folders of optimizer/ that hold no Python of their own.
DATA_FOLDERS = frozenset({"data"})


def layer_of(module: str) -> str:
    """The layer of a dotted module name: `providers`, `policies`, `vocabulary`, `optimizer`
    (the version), or `optimizer.<package>`; a stray top-level module is a layer of its own,
    which no rule knows."""
    parts = module.split(".")
    if parts[:2] == ["providers", "ssh"]:
        return "providers.ssh"
    if parts[0] != "optimizer":
        return parts[0]
    if len(parts) == 1 or parts[1] == "__version__":
        return VERSION
    if parts[1] in VOCABULARY:
        return VOCAB
    return f"optimizer.{parts[1]}"


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def first_party_imports(path: Path, module: str = "") -> set[str]:
    """Modules a file imports from this project; `from a import b` counts as `a.b`, and a
    relative import is resolved against `module` (the file's dotted name)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            names = [f"{base}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        found.update(n for n in names if n.split(".")[0] in TOP_LEVEL)
    return found


def sources(root: Path) -> dict[str, Path]:
    """Every Python module of the project under `root`, by dotted name."""
    return {
        module_name(path, root): path
        for top in TOP_LEVEL
        for path in sorted((root / top).rglob("*.py"))
    }


def imports(root: Path) -> dict[str, set[str]]:
    return {name: first_party_imports(path, name) for name, path in sources(root).items()}


def violations(
    graph: Mapping[str, Iterable[str]], rules: Mapping[str, frozenset[str]]
) -> list[str]:
    """`a imports b (layer -> layer)` for each import into a layer that a's layer may not use,
    and a line for each module whose layer has no rule."""
    bad = []
    for module, names in sorted(graph.items()):
        own = layer_of(module)
        if own not in rules:
            bad.append(f"{module} is in no layer: move it into a package (or give it a rule)")
            continue
        bad.extend(
            f"{module} imports {name} ({own} -> {layer_of(name)})"
            for name in sorted(names)
            if layer_of(name) != own and layer_of(name) not in rules[own]
        )
    return bad


def _owner_of_private(name: str) -> str | None:
    """Where the first `_private` part of a dotted name lives (`a.b._c.d` -> `a.b`), or None
    when no part is private (dunders such as `__version__` are public)."""
    parts = name.split(".")
    for i, part in enumerate(parts):
        if part.startswith("_") and not (part.startswith("__") and part.endswith("__")):
            return ".".join(parts[:i])
    return None


def face_violations(
    graph: Mapping[str, Iterable[str]],
    internal: frozenset[str] = INTERNAL_MODULES,
    allowed: Mapping[tuple[str, str], str] = FACE_EXCEPTIONS,
) -> list[str]:
    """`a imports b (why)` for each import past a package's face: an internal module (or a
    name in one) from another layer, a `_private` name from another module, a `_private`
    module from outside its package."""
    bad = []
    for module, names in sorted(graph.items()):
        for name in sorted(names):
            if (module, name) in allowed:
                continue
            inner = next((m for m in internal if name == m or name.startswith(m + ".")), None)
            if inner is not None and layer_of(module) != layer_of(inner):
                bad.append(f"{module} imports {name} (internal to {layer_of(inner)})")
                continue
            owner = _owner_of_private(name)
            if owner is not None and not (module == owner or module.startswith(owner + ".")):
                bad.append(f"{module} imports {name} (private to {owner})")
    return bad


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                group.append(top)
                if top == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def layer_graph(graph: Mapping[str, Iterable[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for module, names in graph.items():
        edges = out.setdefault(layer_of(module), set())
        edges.update(layer_of(n) for n in names if layer_of(n) != layer_of(module))
    return out


def module_graph(graph: Mapping[str, Iterable[str]]) -> dict[str, set[str]]:
    """Module -> modules it imports (a name resolves to the longest module it starts with:
    `from optimizer.probes import deep` is optimizer.probes.deep, `... import run_probe` is
    optimizer.probes itself)."""

    def resolve(name: str) -> str | None:
        while name and name not in graph:
            name = name.rpartition(".")[0]
        return name or None

    return {
        module: {m for n in names if (m := resolve(n)) is not None and m != module}
        for module, names in graph.items()
    }


GRAPH = imports(ROOT)


@pytest.mark.parametrize("layer", sorted(MAY_IMPORT))
def test_each_layer_imports_only_what_the_map_allows(layer: str) -> None:
    mine = {m: names for m, names in GRAPH.items() if layer_of(m) == layer}
    assert violations(mine, MAY_IMPORT) == []


def test_every_module_belongs_to_a_layer() -> None:
    """No module of optimizer/ stays at the top level that belongs in a package, and a new
    package gets its rule here."""
    assert [m for m in GRAPH if layer_of(m) not in MAY_IMPORT] == []
    folders = {p.name for p in (ROOT / "optimizer").iterdir() if p.is_dir()}
    folders -= DATA_FOLDERS | {"__pycache__"}
    assert sorted(f for f in folders if f"optimizer.{f}" not in MAY_IMPORT) == []


def test_other_layers_import_only_a_packages_face() -> None:
    assert face_violations(GRAPH) == []


def test_each_face_exception_is_still_needed() -> None:
    """An exception whose import is gone is dropped from the list, not kept as a licence."""
    assert [k for k in FACE_EXCEPTIONS if k[1] not in GRAPH.get(k[0], ())] == []


def test_the_layers_import_each_other_in_no_cycle() -> None:
    assert cycles(layer_graph(GRAPH)) == []


def test_the_map_itself_has_no_cycle() -> None:
    assert cycles({k: set(v) for k, v in MAY_IMPORT.items()}) == []


def test_no_modules_of_a_package_import_each_other_in_a_cycle() -> None:
    assert cycles(module_graph(GRAPH)) == []


# -- the rules can fail ------------------------------------------------------------------------

# For each layer, an import the map forbids it: what a careless change would add.
FORBIDDEN_SAMPLES = {
    COMMON: "from optimizer.model import Offer",
    VERSION: "from optimizer.common import procs",
    VOCAB: "from optimizer.store import Store",
    "providers": "from optimizer.store import Store",
    "providers.ssh": "from optimizer.store import Store",
    "policies": "from optimizer.daemon.config import DaemonConfig",
    "optimizer.probes": "from optimizer.agent import Agent",
    "optimizer.storage": "from optimizer.checkpoints import restore",
    "optimizer.checkpoints": "from optimizer.agent import Agent",
    "optimizer.code": "from optimizer.store import Store",
    "optimizer.agent": "from providers.local.procs import power_off",
    "optimizer.store": "from optimizer.jobs.machine import JobState",
    "optimizer.costs": "from optimizer.store import Store",
    "optimizer.alerts": "from optimizer.daemon.metrics import Metrics",
    "optimizer.jobs": "from optimizer.daemon.errors import DaemonError",
    "optimizer.daemon": "from optimizer.api.serve import daemon_app",
    "optimizer.api": "from optimizer.ui import console_app",
    "optimizer.ui": "from optimizer.cli import app",
    "optimizer.cli": "import optimizer.stray",
}
SAMPLE_FILES = {
    COMMON: "optimizer/common/sample.py",
    VERSION: "optimizer/__init__.py",
    VOCAB: "optimizer/model.py",
    "providers": "providers/sample/api.py",
    "providers.ssh": "providers/ssh/sample.py",
    "policies": "policies/sample.py",
    "optimizer.cli": "optimizer/cli/sample.py",
}


def test_every_layer_has_a_forbidden_sample() -> None:
    assert sorted(FORBIDDEN_SAMPLES) == sorted(MAY_IMPORT)


@pytest.mark.parametrize("layer", sorted(FORBIDDEN_SAMPLES))
def test_each_rule_catches_a_forbidden_import(layer: str, tmp_path: Path) -> None:
    default = f"optimizer/{layer.removeprefix('optimizer.')}/sample.py"
    path = tmp_path / SAMPLE_FILES.get(layer, default)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"from __future__ import annotations\n{FORBIDDEN_SAMPLES[layer]}\n")
    found = violations(imports(tmp_path), MAY_IMPORT)
    assert len(found) == 1 and found[0].startswith(module_name(path, tmp_path)), found


# Imports past a package's face: what a careless change would add.
FACE_SAMPLES = {
    "optimizer/jobs/sample.py": "from optimizer.store.tables import JobRecord",
    "optimizer/daemon/sample.py": "from optimizer.store.engine import StoreError",
    "optimizer/ui/sample.py": "from optimizer.store import tables",
    "optimizer/api/sample.py": "from optimizer.jobs.machine import _relaunch_reason",
    "optimizer/probes/sample.py": "from optimizer.probes.nvml import _parse_gpus",
    "optimizer/cli/sample.py": "from optimizer.probes.active import _dtype",
}


@pytest.mark.parametrize("where", sorted(FACE_SAMPLES))
def test_the_faces_rule_catches_an_import_past_a_face(where: str, tmp_path: Path) -> None:
    path = tmp_path / where
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"from __future__ import annotations\n{FACE_SAMPLES[where]}\n")
    found = face_violations(imports(tmp_path))
    assert len(found) == 1 and found[0].startswith(module_name(path, tmp_path)), found


def test_the_faces_rule_lets_a_package_use_its_own_inside() -> None:
    graph = {
        "optimizer.store.jobs": {"optimizer.store.tables.Job", "optimizer.store.engine.table"},
        "optimizer.probes.active.gemm": {"optimizer.probes.active._dtype.pick"},
        "optimizer.jobs.reconcile": {"optimizer.store.JobRecord", "optimizer.__version__"},
    }
    assert face_violations(graph, allowed={}) == []


def test_allowed_imports_pass(tmp_path: Path) -> None:
    sample = tmp_path / "optimizer" / "agent" / "x.py"
    sample.parent.mkdir(parents=True)
    sample.write_text(
        "from optimizer import __version__, hardware\n"
        "from optimizer.common.procs import proc_start_ticks\n"
        "from optimizer.probes import run_probe\n"
        "from . import y\n"
        "import json\n"
    )
    names = first_party_imports(sample, "optimizer.agent.x")
    assert names == {
        "optimizer.__version__",
        "optimizer.hardware",
        "optimizer.common.procs.proc_start_ticks",
        "optimizer.probes.run_probe",
        "optimizer.agent.y",
    }
    assert violations({"optimizer.agent.x": names}, MAY_IMPORT) == []


def test_lazy_and_type_checking_imports_count(tmp_path: Path) -> None:
    sample = tmp_path / "x.py"
    sample.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from optimizer.api import ApiState\n"
        "def f():\n    import optimizer.cli\n"
    )
    assert first_party_imports(sample, "optimizer.daemon.x") == {
        "optimizer.api.ApiState",
        "optimizer.cli",
    }


def test_a_package_cycle_is_found() -> None:
    graph = {
        "optimizer.store.jobs": {"optimizer.jobs.machine.LIVE"},
        "optimizer.jobs.machine": {"optimizer.store.Store"},
        "optimizer.daemon.x": {"optimizer.store.Store"},
    }
    assert cycles(layer_graph(graph)) == [["optimizer.jobs", "optimizer.store"]]


def test_a_module_cycle_inside_a_package_is_found() -> None:
    graph = {
        "optimizer.probes": {"optimizer.probes.active.gemm"},
        "optimizer.probes.active": {"optimizer.probes.deep"},
        "optimizer.probes.deep": {"optimizer.probes.active._dtype"},
        "optimizer.probes.tensors": set(),
    }
    assert cycles(module_graph(graph)) == [["optimizer.probes.active", "optimizer.probes.deep"]]


def test_a_stray_top_level_module_is_reported() -> None:
    found = violations({"optimizer.store_daemon": set()}, MAY_IMPORT)
    assert found == [
        "optimizer.store_daemon is in no layer: move it into a package (or give it a rule)"
    ]


# -- the reconciler's shape --------------------------------------------------------------------

# The reconciler and its passes (optimizer/jobs/reconcile.py registers them): the daemon's to
# run. The API asks the jobs layer's own answers (the fence: jobs/fence.py) and never borrows
# the reconciler's helpers to decide something itself.
RECONCILER = frozenset(
    f"optimizer.jobs.{name}"
    for name in ("reconcile", "acting", "describe", "moving", "per_job", "watch", "cleanup")
)
MAX_JOBS_MODULE_LINES = 500  # a module of optimizer/jobs past this is doing more than one job


def api_reconciler_imports(graph: Mapping[str, Iterable[str]]) -> list[str]:
    """`a imports b` for each module of optimizer/api that imports the reconciler or a pass."""
    return [
        f"{module} imports {name}"
        for module, names in sorted(graph.items())
        if layer_of(module) == "optimizer.api"
        for name in sorted(names)
        if any(name == r or name.startswith(f"{r}.") for r in RECONCILER)
    ]


def long_jobs_modules(root: Path, limit: int = MAX_JOBS_MODULE_LINES) -> list[str]:
    """`path: N lines` for each module of optimizer/jobs longer than `limit` lines."""
    found = []
    for path in sorted((root / "optimizer" / "jobs").rglob("*.py")):
        lines = len(path.read_text().splitlines())
        if lines > limit:
            found.append(f"{path.relative_to(root).as_posix()}: {lines} lines (at most {limit})")
    return found


def test_the_api_does_not_import_the_reconciler() -> None:
    assert api_reconciler_imports(GRAPH) == []


def test_an_api_module_that_imports_the_reconciler_is_caught(tmp_path: Path) -> None:
    sample = tmp_path / "optimizer" / "api" / "sample.py"
    sample.parent.mkdir(parents=True)
    sample.write_text(
        "from __future__ import annotations\n"
        "from optimizer.jobs.fence import fence_for\n"
        "from optimizer.jobs.reconcile import attempt_view\n"
    )
    assert api_reconciler_imports(imports(tmp_path)) == [
        "optimizer.api.sample imports optimizer.jobs.reconcile.attempt_view"
    ]


def test_no_module_of_jobs_is_over_500_lines() -> None:
    assert long_jobs_modules(ROOT) == []


def test_a_long_jobs_module_is_caught(tmp_path: Path) -> None:
    folder = tmp_path / "optimizer" / "jobs"
    folder.mkdir(parents=True)
    (folder / "short.py").write_text("x = 1\n" * MAX_JOBS_MODULE_LINES)
    (folder / "long.py").write_text("x = 1\n" * (MAX_JOBS_MODULE_LINES + 1))
    assert long_jobs_modules(tmp_path) == ["optimizer/jobs/long.py: 501 lines (at most 500)"]
