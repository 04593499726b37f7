"""The GPU probe beside the shared reference measurements, on the same machine, in one go.

Runs, each in its own process with a time limit, so one failure does not stop the rest:
1. the selection guide's timing script (GUIDE 4.1: a host clock around one un-synchronised
   10000^2 matmul, no warm-up), then the same product measured properly, for docs/probes.md;
2. ../shared/bench/gpu_reference.py (REFERENCE 5.2's calibration figures) -> calibration.json;
3. `gpuopt probe --quick` on the first GPU, then on every GPU (2-GPU all-reduce);
4. the `gpu`-marked tests; 5. the handover probe beside the quick probe on the first GPU,
`--handover-pairs` times (each pair in alternating order): gpu_probe_handover.json holds each
figure's handover/quick ratio, both probes' seconds and whether their verdicts agree;
6. `gpuopt probe --deep` if the time budget allows.
Writes the probe results, the calibration, the seed-script figures and gpu_probe.json (each
probe figure over the same-run calibration figure and over the issue's reference figure) to
--out, and prints the ratio table last.

    python3 bench/gpu_probe.py --reference ../shared/bench/gpu_reference.py --out bench/results
    python3 bench/gpu_probe.py --only-handover --handover-pairs 5     # step 5 alone
    python3 bench/gpu_probe.py --only-handover --cpu --out /tmp/dry   # a dry run with no GPU
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# The reference figures (REFERENCE 5.2, calibration run on an H200 SXM pair).
TARGETS = {
    "gemm.bf16": 759.0,
    "gemm.fp16": 727.0,
    "gemm.tf32": 392.0,
    "gemm.fp32": 51.0,
    "gemm.fp64": 62.0,
    "copy_gbps": 4266.0,
    "h2d_gbps": 55.0,
    "d2h_gbps": 55.0,
    "allreduce_busbw_gbps": 330.0,
}
TARGET_RATIO = 0.95
QUICK_WALL_LIMIT_S = 120.0
HANDOVER_LIMIT_S = 6.0  # issue 31's goal for one H200
HANDOVER_TOLERANCE = 0.05  # each handover figure within 5% of the quick probe's, same run

SEED_SCRIPT = r"""
import json, statistics, sys, time
import torch

def seed():  # GUIDE 4.1 as written (with "cuda" for the undefined name `cuda`)
    x = torch.randn(10000, 10000, device="cuda")
    t = time.time()
    torch.mm(x, x.t())
    return time.time() - t

flop = 2 * 10000**3
default_precision = torch.backends.cuda.matmul.fp32_precision
naive = [seed() for _ in range(3)]
torch.cuda.synchronize()

def proper(tf32):  # events, warm-up, median: REFERENCE 5.1
    torch.backends.cuda.matmul.fp32_precision = "tf32" if tf32 else "ieee"
    x = torch.randn(10000, 10000, device="cuda")
    out = torch.empty_like(x)
    for _ in range(3):
        torch.mm(x, x.t(), out=out)
    torch.cuda.synchronize()
    times = []
    for _ in range(10):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); torch.mm(x, x.t(), out=out); e.record(); e.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    return statistics.median(times)

# A queued product leaks into the next synchronised timing (defect 1).
x = torch.randn(10000, 10000, device="cuda")
torch.cuda.synchronize()
for _ in range(3):
    torch.mm(x, x.t())
t = time.perf_counter(); torch.cuda.synchronize(); leaked = time.perf_counter() - t
fp32, tf32 = proper(False), proper(True)
out = {
    "torch": torch.__version__,
    "device": torch.cuda.get_device_name(0),
    "default_fp32_precision": default_precision,
    "naive_seconds": naive,
    "naive_implied_tflops": [flop / t / 1e12 for t in naive],
    "queued_three_then_synchronize_s": leaked,
    "proper_fp32_seconds": fp32,
    "proper_fp32_tflops": flop / fp32 / 1e12,
    "proper_tf32_seconds": tf32,
    "proper_tf32_tflops": flop / tf32 / 1e12,
}
json.dump(out, open(sys.argv[1], "w"), indent=1)
print(json.dumps(out, indent=1))
"""


FP64_SCRIPT = r"""
import json, sys, time
import pynvml, torch
from optimizer.probes import active

pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
out = {"gemm": {}}
for n in (4096, 8192):  # the probe's method (5 warm-up, 10 timed, median) at both sizes
    out["gemm"][n] = active.gemm("cuda:0", "fp64", n, warmup=5, repeats=10).tflops
time.sleep(3)  # let the clocks recover before the series
a = torch.randn(8192, 8192, device="cuda:0", dtype=torch.float64)
c = torch.empty_like(a)
series = []
for i in range(30):  # cold: no warm-up, one event pair per product, NVML read after each
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record(); torch.mm(a, a, out=c); e.record(); e.synchronize()
    series.append({
        "i": i,
        "tflops": 2 * 8192**3 / (s.elapsed_time(e) / 1e3) / 1e12,
        "sm_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
        "power_w": pynvml.nvmlDeviceGetPowerUsage(h) / 1000,
        "reasons": pynvml.nvmlDeviceGetCurrentClocksEventReasons(h),
    })
out["series_8192"] = series
json.dump(out, open(sys.argv[1], "w"), indent=1)
print(json.dumps(out["gemm"]), [round(r["tflops"], 1) for r in series])
print([r["sm_mhz"] for r in series], [round(r["power_w"]) for r in series])
"""


def step(name: str, argv: list[str], limit: float, env: dict[str, str] | None = None) -> dict:
    """Run one step, echo its output, and say how it ended."""
    print(f"\n=== {name}: {' '.join(argv)}", flush=True)
    began = time.monotonic()
    try:
        done = subprocess.run(
            argv,
            cwd=ROOT,
            env={**os.environ, **(env or {})},
            capture_output=True,
            text=True,
            timeout=limit,
            check=False,
        )
        print(done.stdout[-6000:], done.stderr[-3000:], sep="\n", flush=True)
        rc: int | None = done.returncode
    except subprocess.TimeoutExpired:
        print(f"{name}: killed after {limit:.0f} s", flush=True)
        rc = None
    except OSError as exc:
        print(f"{name}: could not start: {exc}", flush=True)
        rc = None
    return {"rc": rc, "wall_s": round(time.monotonic() - began, 1)}


def _load(path: Path) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads(path.read_text())
        return data
    except (OSError, ValueError):
        return {}


def probe_figures(result: dict[str, Any], gpu: int = 0) -> dict[str, float]:
    figures: dict[str, float] = {}
    for run in result.get("runs") or ():
        if run.get("gpu") != gpu or not run.get("ok"):
            continue
        for g in run.get("gemm") or ():
            figures[f"gemm.{g['dtype']}"] = g["tflops"]
        for key in ("copy_gbps", "h2d_gbps", "d2h_gbps"):
            if run.get(key) is not None:
                figures[key] = run[key]
        if run.get("sustained"):
            figures["sustained.bf16"] = run["sustained"]["tflops_median"]
    for p in (result.get("node") or {}).get("points") or ():
        if p["nbytes"] == 1 << 30:
            figures["allreduce_busbw_gbps"] = p["busbw_gbps"]
    return figures


def cpu_figures(result: dict[str, Any]) -> dict[str, float]:
    """A CPU-only run's figures (the dry run): its GEMMs by dtype."""
    return {
        f"gemm.{g['dtype']}": g["tflops"]
        for run in result.get("runs") or ()
        if run.get("device") == "cpu" and run.get("ok")
        for g in run.get("gemm") or ()
    }


def verdicts(result: dict[str, Any]) -> dict[str, str]:
    """Each check's status by name and GPU, but the sustained check the handover has not."""
    return {
        f"{c['name']}@{c['gpu']}": c["status"]
        for c in result.get("checks") or ()
        if c["name"] != "gemm.bf16.sustained"
    }


def handover_vs_quick(out: Path, pairs: int, env: dict[str, str], cpu: bool) -> dict[str, Any]:
    """The handover and the quick probe side by side on one GPU, `pairs` times, alternating
    which goes first; per figure the handover/quick ratio of each pair, and both probes' own
    seconds (`seconds` in the result: what an agent waits) and the CLI's wall time."""
    py = sys.executable
    env = {**env, "CUDA_VISIBLE_DEVICES": "" if cpu else "0"}
    figures = cpu_figures if cpu else probe_figures
    runs: list[dict[str, Any]] = []
    for i in range(pairs):
        pair: dict[str, Any] = {}
        order = ("handover", "quick") if i % 2 == 0 else ("quick", "handover")
        for kind in order:
            path = out / f"gpu_probe_{'cpu_' if cpu else ''}{kind}_{i}.json"
            path.unlink(missing_ok=True)
            argv = [py, "-m", "optimizer.cli", "probe", f"--{kind}", "-o", str(path)]
            wall = step(f"{kind} probe {i + 1} of {pairs}", argv, 180, env)
            result = _load(path)
            pair[kind] = {
                "wall_s": wall["wall_s"],
                "seconds": result.get("seconds"),
                "status": result.get("status"),
                "gpu_model": result.get("gpu_model"),
                "figures": figures(result),
                "verdicts": verdicts(result),
            }
        h, q = pair["handover"], pair["quick"]
        pair["first"] = order[0]
        pair["ratios"] = {
            k: round(v / q["figures"][k], 4) for k, v in h["figures"].items() if q["figures"].get(k)
        }
        pair["same_verdicts"] = h["verdicts"] == q["verdicts"] and h["status"] == q["status"]
        runs.append(pair)
    ratios: dict[str, list[float]] = {}
    for pair in runs:
        for k, v in pair["ratios"].items():
            ratios.setdefault(k, []).append(v)
    seconds = {k: [p[k]["seconds"] for p in runs if p[k]["seconds"]] for k in ("handover", "quick")}
    quick: dict[str, list[float]] = {}
    for pair in runs:
        for k, v in pair["quick"]["figures"].items():
            quick.setdefault(k, []).append(v)
    return {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "device": "cpu (a dry run: CPU matmuls, not a GPU figure)" if cpu else _gpu_name(runs),
        "pairs": pairs,
        "ratio_range": {k: [min(v), max(v)] for k, v in sorted(ratios.items())},
        # The quick probe against itself: highest over lowest of each figure over the pairs.
        "quick_spread": {k: round(max(v) / min(v), 4) for k, v in sorted(quick.items()) if min(v)},
        "within_5pct": all(abs(r - 1) <= HANDOVER_TOLERANCE for v in ratios.values() for r in v),
        "seconds": {k: [round(x, 2) for x in v] for k, v in seconds.items()},
        "handover_at_most_6s": bool(seconds["handover"])
        and max(seconds["handover"]) <= HANDOVER_LIMIT_S,
        "same_verdicts": all(p["same_verdicts"] for p in runs),
        "runs": runs,
    }


def _gpu_name(runs: list[dict[str, Any]]) -> str | None:
    return next((p[k]["gpu_model"] for p in runs for k in p if k in ("handover", "quick")), None)


def calibration_figures(cal: dict[str, Any]) -> dict[str, float]:
    figures = {f"gemm.{k}": v for k, v in (cal.get("gemm_tflops") or {}).items()}
    for ours, theirs in (("copy_gbps", "d2d_copy_GBps"), ("h2d_gbps", "h2d"), ("d2h_gbps", "d2h")):
        if cal.get(theirs) is not None:
            figures[ours] = cal[theirs]
    if cal.get("allreduce"):
        figures["allreduce_busbw_gbps"] = cal["allreduce"]["busbw_GBps"]
    return figures


def compare(out: Path, walls: dict[str, dict]) -> dict[str, Any]:
    one = _load(out / "gpu_probe_1gpu.json")
    two = _load(out / "gpu_probe_2gpu.json")
    cal = calibration_figures(_load(out / "calibration.json"))
    rows = {}
    for metric, target in TARGETS.items():
        source = two if metric.startswith("allreduce") else one
        value = probe_figures(source).get(metric)
        row: dict[str, Any] = {"probe": value, "calibration": cal.get(metric), "target": target}
        for gpu in (0, 1):
            row[f"probe_2gpu_run_gpu{gpu}"] = probe_figures(two, gpu).get(metric)
        if value is not None:
            row["ratio_to_target"] = round(value / target, 3)
            row["meets_95pct_of_target"] = value >= TARGET_RATIO * target
            if cal.get(metric):
                row["ratio_to_calibration"] = round(value / cal[metric], 3)
        rows[metric] = row
    quick_walls = {k: v for k, v in walls.items() if k.startswith("quick")}
    return {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "device": (_load(out / "calibration.json")).get("device"),
        "torch": one.get("host", {}).get("torch"),
        "driver": one.get("host", {}).get("driver"),
        "statuses": {
            k: _load(out / f"gpu_probe_{k}.json").get("status") for k in ("1gpu", "2gpu", "deep")
        },
        "probe_seconds": {
            k: _load(out / f"gpu_probe_{k}.json").get("seconds") for k in ("1gpu", "2gpu", "deep")
        },
        "quick_within_120s": all(
            (w["wall_s"] or 1e9) <= QUICK_WALL_LIMIT_S for w in quick_walls.values()
        ),
        "steps": walls,
        "metrics": rows,
        "seed_script": _load(out / "seed_naive.json"),
        "fp64_sizes": _load(out / "fp64_sizes.json"),
    }


def write_handover(out: Path, pairs: int, env: dict[str, str], cpu: bool) -> int:
    """Run the side by side, write gpu_probe_handover[_cpu].json and print its figures."""
    summary = handover_vs_quick(out, pairs, env, cpu)
    name = "gpu_probe_handover_cpu.json" if cpu else "gpu_probe_handover.json"
    (out / name).write_text(json.dumps(summary, indent=1) + "\n")
    print(f"\nhandover / quick on {summary['device']}, {pairs} pairs (min..max ratio):")
    for metric, (low, high) in summary["ratio_range"].items():
        spread = summary["quick_spread"].get(metric)
        print(f"  {metric:<16} {low:.3f} .. {high:.3f}   quick's own spread {spread}")
    print("seconds:", summary["seconds"], "same verdicts:", summary["same_verdicts"])
    print("within 5%:", summary["within_5pct"], "handover <= 6 s:", summary["handover_at_most_6s"])
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--reference", type=Path, default=ROOT.parent / "shared/bench/gpu_reference.py"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--budget", type=float, default=540, help="seconds for every step together")
    parser.add_argument("--no-deep", action="store_true")
    parser.add_argument("--fp64-check", action="store_true", help="fp64 GEMM at two sizes")
    parser.add_argument(
        "--handover-pairs", type=int, default=3, help="handover and quick probes side by side"
    )
    parser.add_argument(
        "--only-handover", action="store_true", help="only the handover/quick side by side"
    )
    parser.add_argument(
        "--cpu", action="store_true", help="with --only-handover: a dry run where no GPU is"
    )
    args = parser.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    py = sys.executable
    env = {"PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    if args.only_handover:
        return write_handover(out, args.handover_pairs, env, args.cpu)
    walls: dict[str, dict] = {}
    probe = [py, "-m", "optimizer.cli", "probe", "-o"]

    step("environment", ["nvidia-smi", "topo", "-m"], 30)
    walls["seed"] = step("seed script", [py, "-c", SEED_SCRIPT, str(out / "seed_naive.json")], 150)
    walls["reference"] = step("reference", [py, str(args.reference), str(out)], 300)
    walls["quick_1gpu"] = step(
        "quick probe, GPU 0",
        [*probe, str(out / "gpu_probe_1gpu.json")],
        180,
        {**env, "CUDA_VISIBLE_DEVICES": "0"},
    )
    walls["quick_all"] = step(
        "quick probe, all GPUs", [*probe, str(out / "gpu_probe_2gpu.json")], 180, env
    )
    if args.fp64_check:
        walls["fp64"] = step(
            "fp64 size check", [py, "-c", FP64_SCRIPT, str(out / "fp64_sizes.json")], 120, env
        )
    walls["gpu_tests"] = step(
        "gpu tests",
        [
            py,
            "-m",
            "pytest",
            "--noconftest",
            "-p",
            "no:cacheprovider",
            "-q",
            "-m",
            "gpu",
            "tests/test_probes_gpu.py",
        ],
        180,
        env,
    )
    if args.handover_pairs > 0:
        write_handover(out, args.handover_pairs, env, cpu=False)
    left = args.budget - (time.monotonic() - began)
    if not args.no_deep and left > 200:
        walls["deep"] = step(
            "deep probe, all GPUs",
            [
                py,
                "-m",
                "optimizer.cli",
                "probe",
                "--deep",
                "--timeout",
                str(int(left - 60)),
                "-o",
                str(out / "gpu_probe_deep.json"),
            ],
            left - 20,
            env,
        )
    summary = compare(out, walls)
    (out / "gpu_probe.json").write_text(json.dumps(summary, indent=1) + "\n")
    print("\nmetric                 probe    calib.  p/calib  target  p/target  >=95%")
    for metric, row in summary["metrics"].items():
        v, c = row.get("probe"), row.get("calibration")
        print(
            f"{metric:<22} {v if v is None else f'{v:8.1f}'} {c if c is None else f'{c:8.1f}'} "
            f"{row.get('ratio_to_calibration', '-'):>7} {row['target']:7.0f} "
            f"{row.get('ratio_to_target', '-'):>8}  {row.get('meets_95pct_of_target', '-')}"
        )
    print("walls:", {k: v["wall_s"] for k, v in walls.items()}, "statuses:", summary["statuses"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
