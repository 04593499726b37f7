"""The job bench/handover.py runs: a step loop that logs the wall-clock time of everything.

Each line of `$HANDOVER_STEP_LOG` (appended by every attempt, one JSON object a line) is
`{"ev": ..., "t": <epoch seconds>, "attempt": N, ...}`:

- `start`: the process's first statement (before any import but the standard library's);
- `ready`: the imports done (and, with `--gpu`, CUDA initialised and `--hold-gib` GiB held);
- `resumed`: the step it carries on from (its checkpoint, 0 without one);
- `step`: one step done (`n`);
- `sigterm`: SIGTERM received (`t` is the signal's arrival);
- `saved`: its checkpoint written (`step`), just before it exits with 143.

With `--gpu` a step is one bf16 GEMM of 4096 x 4096 (well under a millisecond on an H200) and
then `--step-s` of sleep, so on a one-GPU host the old job barely loads the GPU its
replacement's probe measures meanwhile; `--hold-gib` is held for the run, as a real job's
weights and optimizer state would be.

The checkpoint is one JSON file in `$GPUOPT_CHECKPOINT_DIR`, replaced atomically on SIGTERM and
every `--checkpoint-every` steps, so an attempt that got its SIGTERM loses no step.

    HANDOVER_STEP_LOG=steps.jsonl GPUOPT_CHECKPOINT_DIR=ckpt python bench/handover_job.py
"""

from __future__ import annotations

import time

STARTED = time.time()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

EXIT_INTERRUPTED = 143
GIB = 1 << 30


class Log:
    def __init__(self, path: str | None) -> None:
        self.path = path
        self.attempt = int(os.environ.get("GPUOPT_ATTEMPT") or 0)

    def __call__(self, ev: str, t: float | None = None, **data: Any) -> None:
        line = json.dumps({"ev": ev, "t": time.time() if t is None else t, "attempt": self.attempt})
        if data:
            line = line[:-1] + ", " + json.dumps(data)[1:]
        if self.path is None:
            print(line, flush=True)
            return
        # One write of one line with O_APPEND: the attempts' lines never interleave.
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--step-s", type=float, default=0.05, help="seconds a step takes")
    parser.add_argument("--checkpoint-every", type=int, default=100)
    parser.add_argument("--gpu", action="store_true", help="torch on CUDA: a GEMM per step")
    parser.add_argument("--hold-gib", type=float, default=0.0, help="GPU memory to hold (--gpu)")
    return parser.parse_args(argv)


def _checkpoint_path() -> Path:
    folder = Path(os.environ.get("GPUOPT_CHECKPOINT_DIR") or "checkpoints")
    folder.mkdir(parents=True, exist_ok=True)
    return folder / "handover-state.json"


def _load(path: Path) -> int:
    try:
        return int(json.loads(path.read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def _save(path: Path, step: int) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w") as f:
        json.dump({"step": step}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class _Stop:
    at: float | None = None

    def __call__(self, _signum: int, _frame: object) -> None:
        if self.at is None:
            self.at = time.time()


def _gpu_step(hold_gib: float) -> Any:
    """A step on CUDA: a bf16 GEMM, synchronised; `hold_gib` GiB allocated for the run."""
    import torch

    device = torch.device("cuda")
    held = torch.empty(int(hold_gib * GIB), dtype=torch.uint8, device=device) if hold_gib else None
    a = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16)
    torch.cuda.synchronize()

    def step() -> None:
        (a @ b).sum().item()

    step.held = held  # type: ignore[attr-defined]
    return step


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    log = Log(os.environ.get("HANDOVER_STEP_LOG"))
    log("start", STARTED, pid=os.getpid())
    stop = _Stop()
    signal.signal(signal.SIGTERM, stop)
    work = _gpu_step(args.hold_gib) if args.gpu else None
    log("ready", gpu=bool(args.gpu))
    from optimizer.standby import wait_for_go  # standard library only

    if wait_for_go():  # in standby (docs/standby.md): started up, waited for the go
        log("go")
    path = _checkpoint_path()
    step = _load(path)
    log("resumed", step=step)
    while True:
        if stop.at is not None:
            log("sigterm", stop.at, step=step)
            _save(path, step)
            log("saved", step=step)
            return EXIT_INTERRUPTED
        if work is not None:
            work()
            if args.step_s:
                time.sleep(args.step_s)
        else:
            time.sleep(args.step_s)
        step += 1
        log("step", n=step)
        if step % args.checkpoint_every == 0:
            _save(path, step)


if __name__ == "__main__":
    sys.exit(main())
