"""gpuopt's multi-node example: data-parallel training across the nodes of a gang.

Each node runs this script once (one process per node). torch.distributed meets at the
rendezvous the gpuopt agent hands the job (`MASTER_ADDR`, `MASTER_PORT`, `RANK`,
`WORLD_SIZE`, also as `GPUOPT_NODE_RANK`, `GPUOPT_NUM_NODES`, `GPUOPT_MASTER_*`) with the
gloo backend, so it runs on CPU (the local cloud's nodes are processes on one host). Every
step each node computes the gradient of its own shard of the batch and the nodes average
them with an all-reduce.

Rank 0 alone writes checkpoints into `GPUOPT_CHECKPOINT_DIR` (every `--checkpoint-every`
steps, and when SIGTERM asks the job to stop); every node resumes from the newest one. On
SIGTERM the nodes agree, at the next step boundary, to stop together (an all-reduce of the
stop flag), rank 0 checkpoints and all exit 143. Across any number of replacements the job
stops at exactly `--steps` steps.

    GPUOPT_CHECKPOINT_DIR=/tmp/ckpt MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 WORLD_SIZE=2 \\
        RANK=0 python examples/train_multinode.py --steps 100 &   # and RANK=1 beside it
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

EXIT_INTERRUPTED = 143


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument(
        "--checkpoint-dir", default=os.environ.get("GPUOPT_CHECKPOINT_DIR") or "checkpoints"
    )
    parser.add_argument("--batch", type=int, default=64, help="per node")
    parser.add_argument("--step-sleep", type=float, default=0.0)
    args = parser.parse_args(argv)
    if args.steps < 1 or args.checkpoint_every < 1:
        parser.error("--steps and --checkpoint-every must be >= 1")
    return args


class Stop:
    """Set by SIGTERM/SIGINT; checked between steps."""

    def __init__(self) -> None:
        self.signum: int | None = None
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._handle)

    def _handle(self, signum: int, _frame: Any) -> None:
        self.signum = signum


MARKER = ".gpuopt-committed"  # gpuopt's commit marker, written last (docs/checkpoints.md)


def newest(folder: Path) -> Path | None:
    """The newest committed checkpoint's state file."""
    found = sorted(p for p in folder.glob("step-*") if (p / MARKER).is_file())
    return found[-1] / "state.pt" if found else None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    stop = Stop()
    import torch
    import torch.distributed as dist
    from torch import nn

    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))
    folder = Path(args.checkpoint_dir)
    folder.mkdir(parents=True, exist_ok=True)

    torch.manual_seed(0)
    features = 16
    truth = torch.randn(features, 1, generator=torch.Generator().manual_seed(1234))
    model = nn.Sequential(nn.Linear(features, 32), nn.Tanh(), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    step, runs = 0, []
    found = newest(folder)
    if found is not None:
        state = torch.load(found, map_location="cpu", weights_only=False)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step, runs = int(state["step"]), list(state["runs"])
    print(f"node {rank}/{world}: starting at step {step}", flush=True)
    run = {"attempt": os.environ.get("GPUOPT_ATTEMPT"), "from_step": step, "to_step": step}
    runs.append(run)

    def checkpoint(done: dict[str, Any] | None = None) -> None:
        if rank != 0:
            return
        run["to_step"] = step
        path = folder / f"step-{step:08d}"
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        state = {"step": step, "model": model.state_dict(), "runs": runs}
        state["optimizer"] = optimizer.state_dict()
        torch.save(state, path / "state.pt")
        if done is not None:  # the run's summary travels with its last checkpoint
            (path / "done.json").write_text(json.dumps(done) + "\n")
        marker = path / f".{MARKER}.tmp"
        marker.write_text(json.dumps({"step": step}))
        os.replace(marker, path / MARKER)  # committed: a reader sees all of it or none
        if not os.environ.get("GPUOPT_CHECKPOINT_URI"):  # else gpuopt's agent prunes
            done = sorted(p for p in folder.glob("step-*") if (p / MARKER).is_file())
            for old in done[:-2]:
                shutil.rmtree(old, ignore_errors=True)
        print(f"checkpoint {path.name}", flush=True)

    while step < args.steps:
        # Stop together: any node's SIGTERM stops every node at this step boundary.
        flag = torch.tensor([1.0 if stop.signum is not None else 0.0])
        dist.all_reduce(flag)
        if flag.item() > 0:
            checkpoint()
            print(f"node {rank}: stopped at step {step}/{args.steps}", flush=True)
            return EXIT_INTERRUPTED
        gen = torch.Generator().manual_seed(step * world + rank)  # this node's shard
        x = torch.randn(args.batch, features, generator=gen)
        loss = nn.functional.mse_loss(model(x), torch.tanh(x @ truth))
        optimizer.zero_grad()
        loss.backward()
        for param in model.parameters():
            assert param.grad is not None
            dist.all_reduce(param.grad)
            param.grad /= world
        optimizer.step()
        step += 1
        if step % args.checkpoint_every == 0 and step < args.steps:
            checkpoint()
        if args.step_sleep:
            time.sleep(args.step_sleep)
    run["to_step"] = step
    done = {"steps": step, "nodes": world, "runs": runs}
    checkpoint(done)
    if rank == 0:
        (folder / "done.json").write_text(json.dumps(done) + "\n")
    print(f"node {rank}: finished {step}/{args.steps} steps", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
