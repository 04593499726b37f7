"""A small real training loop that survives spot interruptions: gpuopt's example job.

It trains a two-layer MLP on a fixed synthetic regression task with torch (CPU is fine,
CUDA is used when present; `--engine numpy` trains the same model with numpy alone, and is
what runs where torch is not installed), saves a checkpoint every `--checkpoint-every` steps into
`GPUOPT_CHECKPOINT_DIR`, and on start resumes from the newest checkpoint there. On SIGTERM
(what the gpuopt agent sends when the instance is about to be taken back) it finishes the
current step, checkpoints and exits with 143. Run it again and it carries on; across any
number of interruptions it stops at exactly `--steps` steps.

    GPUOPT_CHECKPOINT_DIR=/tmp/ckpt python examples/train_with_checkpoints.py --steps 300

Each checkpoint is a folder `step-NNNNNNNN/` committed by gpuopt's convention (its marker
file `.gpuopt-committed` written last, docs/checkpoints.md), so an interruption in the middle
of a save leaves the previous checkpoint the newest complete one, and the gpuopt agent can
ship each committed folder to object storage as soon as it appears. The data batches are drawn
from a generator seeded by the step number, so a resumed run sees the same batches an
uninterrupted one would.

Every `--progress-every` steps it reports how far it has got by gpuopt's progress convention
(a JSON line `{"step": n, "total": N}` appended to `$GPUOPT_PROGRESS_FILE`, docs/progress.md),
so `gpuopt jobs show` gives its speed and ETA; outside gpuopt the variable is unset and
nothing is written.

It supports standby start (docs/standby.md; `standby: true` in its job spec): it imports
torch, initialises CUDA and builds its model first, then calls `wait_for_go()`, and loads
the checkpoint only after it returns. A replacement's agent may so start it while the old
attempt's job still runs, and give the go the moment that one has ended and its checkpoint
is restored. Outside standby `wait_for_go()` returns at once. A job without that call simply
leaves `standby` out of its spec and starts as it always has, once the old job has ended.

`--step-log FILE` (or `$STEP_LOG`) appends `{"step": n, "t": <epoch seconds>, "attempt": ...}`
per step: the times a handover is measured by (bench/standby.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

EXIT_INTERRUPTED = 143  # 128 + SIGTERM, what a shell reports for a job ended by SIGTERM
KEEP = 2  # checkpoints kept (the newest and one before it)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    env = os.environ
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=int(env.get("TRAIN_STEPS", 600)))
    parser.add_argument(
        "--checkpoint-every", type=int, default=int(env.get("CHECKPOINT_EVERY", 50))
    )
    parser.add_argument(
        "--checkpoint-dir",
        default=env.get("GPUOPT_CHECKPOINT_DIR") or "checkpoints",
        help="default: $GPUOPT_CHECKPOINT_DIR, else ./checkpoints",
    )
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument(
        "--step-sleep",
        type=float,
        default=float(env.get("STEP_SLEEP", 0.0)),
        help="pause after each step, seconds (to make a demo long enough to interrupt)",
    )
    parser.add_argument("--log-every", type=int, default=int(env.get("LOG_EVERY", 50)))
    parser.add_argument(
        "--engine",
        choices=("auto", "torch", "numpy"),
        default=env.get("TRAIN_ENGINE", "auto"),
        help="auto: torch where it is installed, else numpy (the same model and batches)",
    )
    parser.add_argument(
        "--progress-every", type=int, default=int(env.get("PROGRESS_EVERY", 10)), help="steps"
    )
    parser.add_argument("--step-log", default=env.get("STEP_LOG"), help="a line per step")
    parser.add_argument(
        "--which-engine", action="store_true", help="print the engine it would train with, exit"
    )
    args = parser.parse_args(argv)
    if args.steps < 1 or args.checkpoint_every < 1:
        parser.error("--steps and --checkpoint-every must be >= 1")
    if args.engine not in ("auto", "torch", "numpy"):  # argparse leaves a default unchecked
        parser.error(f"TRAIN_ENGINE: {args.engine!r} is not auto, torch or numpy")
    return args


class Stop:
    """Set by SIGTERM/SIGINT; the loop checks it between steps."""

    def __init__(self) -> None:
        self.signum: int | None = None
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._handle)

    def _handle(self, signum: int, _frame: Any) -> None:
        self.signum = signum


MARKER = ".gpuopt-committed"  # written last: the folder is a complete checkpoint

try:  # gpuopt's helper (standard library only); the same line by hand where it is missing
    from optimizer.progress import report
except ImportError:

    def report(step: int, total: int | None = None, *, path: str | None = None) -> bool:
        target = path or os.environ.get("GPUOPT_PROGRESS_FILE")
        if not target:
            return False
        with open(target, "a", encoding="utf-8") as out:
            out.write(json.dumps({"step": step, "total": total}) + "\n")
        return True


try:  # gpuopt's standby helper (standard library only); by hand where it is missing
    from optimizer.standby import wait_for_go
except ImportError:

    def wait_for_go(timeout: float | None = None) -> bool:
        # The go file becomes a regular file holding `go` or `stop` (docs/standby.md).
        path = os.environ.get("GPUOPT_GO_FILE")
        if os.environ.get("GPUOPT_STANDBY") != "1" or not path:
            return False
        while not os.path.isfile(path):
            time.sleep(0.01)
        with open(path, encoding="utf-8") as f:
            if f.read().strip() == "stop":
                raise SystemExit(EXIT_INTERRUPTED)
        return True


def checkpoints(folder: Path) -> list[Path]:
    """Committed checkpoint folders (`step-NNNNNNNN/` holding the marker), newest first."""
    found = []
    for path in folder.glob("step-*"):
        try:
            step = int(path.name.split("-", 1)[1])
        except ValueError:
            continue
        if (path / MARKER).is_file():
            found.append((step, path))
    return [p for _, p in sorted(found, reverse=True)]


def save(
    folder: Path, engine: Engine, state: dict[str, Any], extra: dict[str, Any] | None = None
) -> Path:
    """One checkpoint, committed by gpuopt's convention (docs/checkpoints.md): a folder of
    its own, and the marker file written last, so a reader (the job after a restart, or the
    gpuopt agent uploading it) sees either a complete checkpoint or none."""
    path = folder / f"step-{state['step']:08d}"
    if path.exists():  # the same step saved again (a stop right after a periodic save)
        shutil.rmtree(path)
    path.mkdir(parents=True)
    engine.save(path, state)
    for name, value in (extra or {}).items():
        (path / name).write_text(json.dumps(value) + "\n")
    marker = path / f".{MARKER}.tmp"
    marker.write_text(json.dumps({"step": state["step"]}))
    os.replace(marker, path / MARKER)
    # Where gpuopt ships checkpoints to object storage (GPUOPT_CHECKPOINT_URI is set), its
    # agent prunes uploaded folders itself; elsewhere the job keeps the newest KEEP.
    if not os.environ.get("GPUOPT_CHECKPOINT_URI"):
        for old in checkpoints(folder)[KEEP:]:
            shutil.rmtree(old, ignore_errors=True)
    return path


def load_latest(folder: Path, engine: Engine) -> dict[str, Any] | None:
    for path in checkpoints(folder):
        try:
            return engine.load(path)
        except Exception as exc:  # a damaged file: fall back to the one before it
            print(f"skipping unreadable checkpoint {path.name}: {exc}", flush=True)
    return None


FEATURES = 16


class Engine:
    """One training step of the model, and its state in and out of a checkpoint folder."""

    def step(self, step: int) -> float:
        raise NotImplementedError

    def weights(self) -> dict[str, Any]:
        raise NotImplementedError

    def restore(self, state: dict[str, Any]) -> None:
        raise NotImplementedError

    def save(self, path: Path, state: dict[str, Any]) -> None:
        raise NotImplementedError

    def load(self, path: Path) -> dict[str, Any]:
        raise NotImplementedError


class TorchEngine(Engine):
    def __init__(self, args: argparse.Namespace) -> None:
        import torch
        from torch import nn

        self.torch, self.nn = torch, nn
        torch.manual_seed(0)
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        gen = torch.Generator().manual_seed(1234)
        self.truth = torch.randn(FEATURES, 1, generator=gen).to(self.device)
        self.batch = args.batch
        self.model = nn.Sequential(
            nn.Linear(FEATURES, args.hidden), nn.Tanh(), nn.Linear(args.hidden, 1)
        )
        self.model.to(self.device)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=args.lr, momentum=0.9)

    def step(self, step: int) -> float:
        torch = self.torch
        gen = torch.Generator().manual_seed(step)  # the same batch for a step, resumed or not
        x = torch.randn(self.batch, FEATURES, generator=gen).to(self.device)
        y = torch.tanh(x @ self.truth)
        loss = self.nn.functional.mse_loss(self.model(x), y)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return float(loss.item())

    def weights(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def restore(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])

    def save(self, path: Path, state: dict[str, Any]) -> None:
        self.torch.save(state, path / "state.pt")

    def load(self, path: Path) -> dict[str, Any]:
        loaded: dict[str, Any] = self.torch.load(
            path / "state.pt", map_location="cpu", weights_only=False
        )
        return loaded


class NumpyEngine(Engine):
    """The same two-layer MLP (tanh, mean squared error, SGD with momentum 0.9) in numpy."""

    def __init__(self, args: argparse.Namespace) -> None:
        import numpy as np

        self.np = np
        rng = np.random.default_rng(0)
        self.truth = np.random.default_rng(1234).standard_normal((FEATURES, 1))
        self.batch, self.lr = args.batch, args.lr
        bound1, bound2 = 1 / np.sqrt(FEATURES), 1 / np.sqrt(args.hidden)
        self.params = {
            "w1": rng.uniform(-bound1, bound1, (FEATURES, args.hidden)),
            "b1": rng.uniform(-bound1, bound1, args.hidden),
            "w2": rng.uniform(-bound2, bound2, (args.hidden, 1)),
            "b2": rng.uniform(-bound2, bound2, 1),
        }
        self.momentum = {name: np.zeros_like(value) for name, value in self.params.items()}

    def step(self, step: int) -> float:
        np, p = self.np, self.params
        x = np.random.default_rng(step).standard_normal((self.batch, FEATURES))
        y = np.tanh(x @ self.truth)
        h = np.tanh(x @ p["w1"] + p["b1"])
        out = h @ p["w2"] + p["b2"]
        loss = float(np.mean((out - y) ** 2))
        d_out = 2 * (out - y) / out.size
        d_h = (d_out @ p["w2"].T) * (1 - h**2)
        grads = {
            "w2": h.T @ d_out,
            "b2": d_out.sum(axis=0),
            "w1": x.T @ d_h,
            "b1": d_h.sum(axis=0),
        }
        for name, grad in grads.items():
            self.momentum[name] = 0.9 * self.momentum[name] + grad
            p[name] -= self.lr * self.momentum[name]
        return loss

    def weights(self) -> dict[str, Any]:
        return {"model": self.params, "optimizer": self.momentum}

    def restore(self, state: dict[str, Any]) -> None:
        self.params = {k: v.copy() for k, v in state["model"].items()}
        self.momentum = {k: v.copy() for k, v in state["optimizer"].items()}

    def save(self, path: Path, state: dict[str, Any]) -> None:
        arrays = {f"model.{k}": v for k, v in state["model"].items()}
        arrays |= {f"optimizer.{k}": v for k, v in state["optimizer"].items()}
        with open(path / "state.npz", "wb") as f:
            self.np.savez(f, **arrays)
        rest = {k: v for k, v in state.items() if k not in ("model", "optimizer")}
        (path / "state.json").write_text(json.dumps(rest) + "\n")

    def load(self, path: Path) -> dict[str, Any]:
        state: dict[str, Any] = json.loads((path / "state.json").read_text())
        state["model"], state["optimizer"] = {}, {}
        with self.np.load(path / "state.npz") as arrays:
            for key in arrays.files:
                part, name = key.split(".", 1)
                state[part][name] = arrays[key]
        return state


def engine_name(args: argparse.Namespace) -> str:
    """`torch` or `numpy`: `auto` takes torch where it is installed."""
    import importlib.util

    if args.engine != "auto":
        return str(args.engine)
    return "torch" if importlib.util.find_spec("torch") is not None else "numpy"


def engine_for(args: argparse.Namespace) -> Engine:
    return TorchEngine(args) if engine_name(args) == "torch" else NumpyEngine(args)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.which_engine:  # the example spec's setup: say which engine will train
        print(f"engine: {engine_name(args)}")
        return 0
    stop = Stop()  # before importing torch, so an early SIGTERM is not lost
    engine = engine_for(args)  # imports, CUDA, the model: all that needs no checkpoint
    if os.environ.get("GPUOPT_STANDBY") == "1":
        print("standby: model built, waiting for the go", flush=True)
    if wait_for_go():  # started in standby: the checkpoint is in place once this returns
        print("standby: go given", flush=True)
    step_log = open(args.step_log, "a", encoding="utf-8") if args.step_log else None  # noqa: SIM115
    folder = Path(args.checkpoint_dir)
    folder.mkdir(parents=True, exist_ok=True)

    step = 0
    runs: list[dict[str, Any]] = []
    state = load_latest(folder, engine)
    if state is not None:
        engine.restore(state)
        step, runs = int(state["step"]), list(state.get("runs", []))
        print(f"resumed from step {step} ({len(runs)} earlier run(s))", flush=True)
    else:
        print("no checkpoint: starting from step 0", flush=True)
    run = {
        "attempt": os.environ.get("GPUOPT_ATTEMPT"),
        "restarts": os.environ.get("GPUOPT_RESTARTS"),
        "from_step": step,
        "to_step": step,
    }
    runs.append(run)

    def checkpoint(loss: float, extra: dict[str, Any] | None = None) -> None:
        run["to_step"] = step
        state = {
            "step": step,
            **engine.weights(),
            "loss": loss,
            "runs": runs,
            "total_steps": args.steps,
        }
        path = save(folder, engine, state, extra)
        print(f"checkpoint {path.name} (step {step})", flush=True)

    loss_value = float("nan")
    started = time.monotonic()
    while step < args.steps:
        if stop.signum is not None:
            checkpoint(loss_value)
            print(f"signal {stop.signum}: stopped at step {step}/{args.steps}", flush=True)
            return EXIT_INTERRUPTED
        loss_value = engine.step(step)
        step += 1
        if step_log is not None:
            line = {"step": step, "t": time.time(), "attempt": run["attempt"]}
            step_log.write(json.dumps(line) + "\n")
            step_log.flush()
        if step % args.log_every == 0 or step == args.steps:
            print(f"step {step}/{args.steps} loss {loss_value:.5f}", flush=True)
        if step % args.progress_every == 0 or step == args.steps:
            report(step, args.steps)
        if step % args.checkpoint_every == 0 and step < args.steps:
            checkpoint(loss_value)
        if args.step_sleep:
            time.sleep(args.step_sleep)
    seconds = time.monotonic() - started
    run["to_step"] = step
    summary = {"steps": step, "loss": loss_value, "seconds": round(seconds, 2), "runs": runs}
    # The last checkpoint carries the run's summary, so it travels wherever checkpoints go.
    checkpoint(loss_value, {"done.json": summary})
    (folder / "done.json").write_text(json.dumps(summary) + "\n")
    print(f"finished: {step}/{args.steps} steps over {len(runs)} run(s), loss {loss_value:.5f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
