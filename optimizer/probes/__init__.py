"""GPU probes: passive NVML health, active benchmarks in subprocesses, and a pure verdict.

Importing this package loads neither torch nor pynvml: torch is imported only inside the
active-probe subprocesses (`python -m optimizer.probes.active`), pynvml only when a
`PynvmlSource` is opened. docs/probes.md describes the method, thresholds and JSON schema.
"""

from optimizer.probes.nvml import HealthSource, NvmlUnavailable, PynvmlSource
from optimizer.probes.procs import ChildOutcome, run_children
from optimizer.probes.readings import (
    GpuHealth,
    LoadSample,
    LoadSummary,
    NodeHealth,
    RemappedRows,
    XidEvent,
    summarize,
)
from optimizer.probes.runner import (
    DEEP,
    HANDOVER,
    KINDS,
    QUICK,
    ProbeOptions,
    run_probe,
)
from optimizer.probes.schema import (
    SCHEMA_ID,
    SCHEMA_VERSION,
    Check,
    DeviceRun,
    NodeRun,
    ProbeResult,
    Status,
)
from optimizer.probes.verdict import (
    Observations,
    gpu_spec,
    history_medians,
    judge,
    measured_tflops,
    overall,
)

__all__ = [
    "DEEP",
    "HANDOVER",
    "KINDS",
    "QUICK",
    "SCHEMA_ID",
    "SCHEMA_VERSION",
    "Check",
    "ChildOutcome",
    "DeviceRun",
    "GpuHealth",
    "HealthSource",
    "LoadSample",
    "LoadSummary",
    "NodeHealth",
    "NodeRun",
    "NvmlUnavailable",
    "Observations",
    "ProbeOptions",
    "ProbeResult",
    "PynvmlSource",
    "RemappedRows",
    "Status",
    "XidEvent",
    "gpu_spec",
    "history_medians",
    "judge",
    "measured_tflops",
    "overall",
    "run_children",
    "run_probe",
    "summarize",
]
