"""Checkpoint upload and restore through a directory-backed object store on the local disk
(tests/helpers/fake_store.py): the upload's rate (files in parallel, sha256 on the way), a
full restore's, and a restore after a prefetch when only the optimizer state changed (what a
hot handover's replacement fetches after the fence). Local disk only: the figures bound the
agent's own cost (hashing, copying), not a cloud bucket's bandwidth. Prints figures and
writes them to bench/results/checkpoints.json.

    python bench/checkpoints.py [--mib 256]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

if not __package__:
    os.chdir(ROOT)
    os.execv(sys.executable, [sys.executable, "-m", "bench.checkpoints", *sys.argv[1:]])

from optimizer.checkpoints import Uploader, commit, prefetch, restore  # noqa: E402
from tests.helpers.fake_store import FakeStore  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "checkpoints.json"
MIB = 1 << 20


def write(folder: Path, files: dict[str, bytes], step: int) -> None:
    folder.mkdir(parents=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    commit(folder, step)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=256, help="size of one checkpoint")
    args = parser.parse_args()
    figures: dict[str, Any] = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "checkpoint_mib": args.mib,
        "load_average_1m": round(os.getloadavg()[0], 1),  # figures are noisy under load
    }
    model = os.urandom(args.mib * 3 // 4 * MIB)
    optimizer = os.urandom(args.mib // 4 * MIB - 1024)
    started = time.perf_counter()
    hashlib.sha256(model).hexdigest()
    figures["sha256_mib_s"] = round(len(model) / MIB / (time.perf_counter() - started), 1)
    with tempfile.TemporaryDirectory(prefix="gpuopt-bench-ckpt-") as tmp:
        root = Path(tmp)
        store = FakeStore(root / "bucket")
        old = root / "old"
        up = Uploader(store, old, scan_s=3600)
        write(
            old / "step-1", {"model.pt": model, "optimizer.pt": optimizer, "meta": b"x" * 1024}, 1
        )
        [first] = up.flush(600)
        figures["upload_s"] = round(first.seconds, 3)
        figures["upload_mib_s"] = round(first.mib_s, 1)
        full = restore(store, root / "fresh")
        assert full is not None
        figures["restore_full_s"] = round(full.seconds, 3)
        figures["restore_full_mib_s"] = round(full.mib_s, 1)
        staged = prefetch(store, root / "new" / "staging")
        assert staged is not None
        figures["prefetch_s"] = round(staged.seconds, 3)
        changed = os.urandom(len(optimizer))
        write(old / "step-2", {"model.pt": model, "optimizer.pt": changed, "meta": b"y" * 1024}, 2)
        up.flush(600)
        up.stop()
        after = restore(store, root / "new" / "checkpoints", staging=root / "new" / "staging")
        assert after is not None and after.name == "step-2"
        figures["restore_after_prefetch_s"] = round(after.seconds, 3)
        figures["restore_after_prefetch_fetched_mib"] = round(after.fetched_bytes / MIB, 1)
        figures["restore_after_prefetch_reused_mib"] = round(after.reused_bytes / MIB, 1)
    for key, value in figures.items():
        print(f"{key:40} {value}")
    RESULTS.write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    main()
