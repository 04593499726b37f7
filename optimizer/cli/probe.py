"""`gpuopt probe`: check this machine's GPUs (health and speed) and print the verdict."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from optimizer.cli.common import fail


def probe(
    quick: Annotated[
        bool, typer.Option("--quick", help="Health plus short benchmarks (default; < 120 s).")
    ] = False,
    deep: Annotated[
        bool,
        typer.Option(
            "--deep",
            help="Also a sustained load, a memory pattern test and an all-reduce sweep (minutes).",
        ),
    ] = False,
    handover: Annotated[
        bool,
        typer.Option(
            "--handover",
            help="The quick probe's stages with shorter timing and no sustained load (seconds).",
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
    timeout: Annotated[
        float | None,
        typer.Option(
            "--timeout",
            min=1,
            help="Hard limit per probe subprocess, seconds (handover 30, quick 55, deep 900).",
            show_default=False,
        ),
    ] = None,
    expect_gpus: Annotated[
        int | None,
        typer.Option("--expect-gpus", min=0, help="Fail unless this many GPUs are present."),
    ] = None,
    history: Annotated[
        list[Path] | None,
        typer.Option(
            "--history",
            help="Earlier probe results (JSON files); below 0.8x their median fails. Repeatable.",
            exists=True,
            dir_okay=False,
        ),
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="Also write the JSON result to this file."),
    ] = None,
) -> None:
    """Probe the GPUs (all that CUDA_VISIBLE_DEVICES shows). Exit 0 pass/warn, 1 fail.

    With no CUDA device it says so and times CPU matmuls instead.
    """
    if quick + deep + handover > 1:
        fail("--quick, --deep and --handover exclude each other")
    if output is not None and not output.parent.is_dir():  # before minutes of probing
        fail(f"--output {output}: no such directory {output.parent}")
    from optimizer.probes import DEEP, HANDOVER, QUICK, ProbeOptions, Status, run_probe

    earlier = _read_history(history or [])
    options = ProbeOptions(
        kind=DEEP if deep else HANDOVER if handover else QUICK,
        timeout_s=timeout,
        expected_gpus=expect_gpus,
        visible=os.environ.get("CUDA_VISIBLE_DEVICES"),
        earlier_results=tuple(earlier),
    )
    result = run_probe(options)
    data = result.to_dict()
    if output is not None:
        try:
            output.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
        except OSError as exc:
            fail(f"--output {output}: {exc.strerror}")
    if as_json:
        json.dump(data, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        _print_checks(data)
    raise typer.Exit(1 if result.status is Status.FAIL else 0)


def _read_history(paths: list[Path]) -> list[dict[str, Any]]:
    out = []
    for path in paths:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            fail(f"--history {path}: {exc}")
        out.extend(data if isinstance(data, list) else [data])
    return out


_MARK = {"pass": "PASS", "warn": "WARN", "fail": "FAIL", "skip": "n/a "}


def _print_checks(data: dict[str, Any]) -> None:
    model = data.get("gpu_model") or data["backend"]
    print(f"gpuopt probe ({data['kind']}): {model}, {data['seconds']:.1f} s")
    for c in data["checks"]:
        where = "node" if c["gpu"] is None else f"gpu{c['gpu']}"
        print(f"  {_MARK[c['status']]}  {where:<5} {c['name']:<26} {c['reason']}")
    counts: dict[str, int] = {}
    for c in data["checks"]:
        counts[c["status"]] = counts.get(c["status"], 0) + 1
    summary = ", ".join(f"{counts.get(k, 0)} {k}" for k in ("pass", "warn", "fail"))
    print(f"{data['status'].upper()}: {summary}")
