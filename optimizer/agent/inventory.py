"""`python -m optimizer.agent.inventory`: what a machine has, as one JSON object on stdout.

The daemon runs it over SSH when an owned machine is added, before any job, so it imports
little (no torch, no pydantic, no httpx) and never fails for want of a GPU: NVML's GPUs, or
where NVML finds none, the simulated ones GPUOPT_SIMULATED_GPUS names ("2xT4", "2xT4-16GB":
count x model[-memory]), or none. Exit 0, or 2 with one line on stderr for a bad argument or
a bad GPUOPT_SIMULATED_GPUS.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

from optimizer import __version__, hardware
from optimizer.probes.nvml import HealthSource, NvmlUnavailable, PynvmlSource
from optimizer.probes.verdict import gpu_spec

ENV_SIMULATED_GPUS = "GPUOPT_SIMULATED_GPUS"
_SIMULATED = re.compile(r"(?P<count>\d+)x(?P<model>.+?)(?:-(?P<gb>\d+(?:\.\d+)?)GB)?", re.I)


class InventoryError(ValueError):
    """A bad argument or GPUOPT_SIMULATED_GPUS value; its message is the one line shown."""


def simulated_gpus(value: str) -> list[dict[str, Any]]:
    """The GPUs GPUOPT_SIMULATED_GPUS names: `count`x`model`[-`memory`GB]; the memory, where
    not given, is the model's in the GPU table (optimizer/data/gpus.yaml)."""
    match = _SIMULATED.fullmatch(value.strip())
    if match is None:
        raise InventoryError(
            f"{ENV_SIMULATED_GPUS}={value!r}: expected COUNTxMODEL[-MEMORYGB],"
            " e.g. 2xT4 or 2xT4-16GB"
        )
    count = int(match["count"])
    if count < 1:
        raise InventoryError(f"{ENV_SIMULATED_GPUS}={value!r}: the count must be at least 1")
    spec = hardware.lookup(match["model"])
    if spec is None and match["gb"]:  # a table name that ends in its memory, "H200-141GB"
        spec = hardware.lookup(f"{match['model']}-{match['gb']}GB")
    if spec is None:
        raise InventoryError(
            f"{ENV_SIMULATED_GPUS}={value!r}: unknown GPU model {match['model']!r}"
        )
    gib = float(match["gb"]) if match["gb"] else spec.memory_gib
    return [
        {
            "index": i,
            "model": spec.name,
            "memory_mib": round(gib * 1024),
            "uuid": f"SIM-{spec.name}-{i}",
        }
        for i in range(count)
    ]


def nvml_gpus(
    open_source: Callable[[], HealthSource] = PynvmlSource,
) -> tuple[list[dict[str, Any]], str | None]:
    """NVML's GPUs (all of them, whatever CUDA_VISIBLE_DEVICES says), models named as the
    probes name them, and None; ([], why) where NVML cannot start (no driver, or
    nvidia-ml-py not installed: the check says so rather than only "no GPU")."""
    try:
        source = open_source()
    except NvmlUnavailable as exc:
        return [], str(exc) or "NVML unavailable"
    try:
        health = source.snapshot()
    finally:
        source.close()
    gpus = [
        {
            "index": gpu.index,
            "model": gpu_spec(gpu.name, gpu.memory_total_bytes).name,
            "memory_mib": (gpu.memory_total_bytes or 0) // (1 << 20),
            "uuid": gpu.uuid,
        }
        for gpu in health.gpus
    ]
    return gpus, None


def inventory(
    folder: Path,
    *,
    environ: Mapping[str, str] = os.environ,
    open_source: Callable[[], HealthSource] = PynvmlSource,
) -> dict[str, Any]:
    """The JSON object the command prints; InventoryError for a bad GPUOPT_SIMULATED_GPUS."""
    gpus, nvml_error = nvml_gpus(open_source)
    simulated = False
    wanted = environ.get(ENV_SIMULATED_GPUS)
    if not gpus and wanted:
        gpus, simulated = simulated_gpus(wanted), True
    return {
        "hostname": socket.gethostname(),
        "gpus": gpus,
        "simulated": simulated,
        "nvml_error": nvml_error,
        "disk_free_gib": round(shutil.disk_usage(folder).free / (1 << 30), 2),
        "python": sys.version.split()[0],
        "gpuopt_version": __version__,
    }


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise InventoryError(message)


def main(
    argv: Sequence[str] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    open_source: Callable[[], HealthSource] = PynvmlSource,
) -> int:
    """Print the inventory; 2 with one line on stderr for a bad argument."""
    env = os.environ if environ is None else environ
    parser = _Parser(prog="python -m optimizer.agent.inventory", description=__doc__)
    parser.add_argument("--dir", help="the folder whose free disk is reported (default: $HOME)")
    try:
        args = parser.parse_args(argv)
        folder = Path(args.dir or env.get("HOME") or Path.home())
        if not folder.is_dir():
            raise InventoryError(f"--dir {folder}: no such folder")
        report = inventory(folder, environ=env, open_source=open_source)
    except InventoryError as exc:
        print(f"inventory: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
