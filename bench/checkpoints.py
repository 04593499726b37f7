"""Checkpoint upload and restore, measured four ways. Prints the figures and writes them to
bench/results/checkpoints.json (each run replaces the sections it ran, keeps the others).

- `local` (the top-level keys): through a directory-backed object store on the local disk
  (tests/helpers/fake_store.py): the upload's rate (files in parallel, sha256 on the way), a
  full restore's, and a restore after a prefetch when only the optimizer state changed. Local
  disk only: the figures bound the agent's own cost (hashing, copying), not a bucket's.
- `s3_restore`: a checkpoint of several files of random bytes uploaded (`upload_one`) to a
  moto_server on loopback (a subprocess) and restored (`restore`) through optimizer.storage's
  S3 backend with the agent's settings, against `cp -r` of the same folder on the same disk
  (this machine's ceiling): MiB/s of each and the ratio.
- `steps_during_upload`: a training-like loop of CPU matmul steps (torch, one thread) timed
  step by step, first alone, then while another process (the agent's part) uploads a
  checkpoint to the moto_server with the `Uploader` thread; p50/p99 and the p99 slowdown.
  Run twice: with every process free to use every CPU ("shared"), and with the steps on
  CPU 0 and the uploader and the server on the others ("pinned", an instance whose agent has
  a core of its own). The server runs on the same machine, so its CPU counts against the
  steps in "shared"; a real bucket's does not.
- `s3_prefetch`: the previous checkpoint prefetched into a staging folder, then the final one
  (one file of N changed) uploaded: the time from its manifest written to the restore done,
  against 1 s + changed bytes / the restore's throughput (issue 29's goal), and without the
  prefetch.

moto is part of what is measured: it reads a whole object for every ranged GET, so the
S3 figures are those of one slow local server, not of S3 (see docs/storage.md).

    python bench/checkpoints.py [--sections local s3 steps prefetch] [--gib 4] [--files 4]
    python bench/checkpoints.py --quick      # small sizes, one repeat, writes nothing
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

if not __package__:
    os.chdir(ROOT)
    os.execv(sys.executable, [sys.executable, "-m", "bench.checkpoints", *sys.argv[1:]])

from bench.object_transfer import write_random  # noqa: E402
from optimizer.checkpoints import Uploader, commit, prefetch, restore  # noqa: E402
from optimizer.checkpoints.convention import read_marker  # noqa: E402
from optimizer.checkpoints.manifest import data_prefix, sha256_file  # noqa: E402
from optimizer.checkpoints.upload import upload_one  # noqa: E402
from optimizer.storage import ObjectStore, open_store  # noqa: E402
from tests.helpers.fake_store import FakeStore  # noqa: E402
from tests.helpers.objstore import S3Server, s3_server  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "checkpoints.json"
MIB = 1 << 20


def write(folder: Path, files: dict[str, bytes], step: int) -> None:
    folder.mkdir(parents=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    commit(folder, step)


def local_section(mib: int) -> dict[str, Any]:
    """Upload, restore and restore after a prefetch through a store on the local disk."""
    figures: dict[str, Any] = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "checkpoint_mib": mib,
        "load_average_1m": round(os.getloadavg()[0], 1),  # figures are noisy under load
    }
    model = os.urandom(mib * 3 // 4 * MIB)
    optimizer = os.urandom(mib // 4 * MIB - 1024)
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
    return figures


# -- helpers for the S3 sections ------------------------------------------------------------------


def rate(size: int, seconds: float) -> float:
    return round(size / MIB / seconds, 1) if seconds > 0 else 0.0


def make_checkpoint(folder: Path, sizes: dict[str, int], step: int) -> None:
    """A committed checkpoint folder of random files (`sizes`: name -> bytes)."""
    folder.mkdir(parents=True)
    for name, size in sizes.items():
        write_random(folder / name, size)
    commit(folder, step)


def upload(store: ObjectStore, folder: Path) -> Any:
    """`upload_one` of a committed folder (the agent's call); returns its Commit."""
    one = read_marker(folder)
    assert one is not None, f"{folder} is not committed"
    return upload_one(store, one)


def empty(store: ObjectStore) -> None:
    """Delete every object (moto keeps them until then)."""
    store.delete([info.key for info in store.list()])


@contextmanager
def server_env(server: S3Server) -> Iterator[None]:
    saved = {key: os.environ.get(key) for key in server.env}
    os.environ.update(server.env)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


# -- 1: restore from S3 against cp -r -----------------------------------------------------------


def s3_restore_section(root: Path, size: int, files: int) -> dict[str, Any]:
    each = size // files
    source = root / "source" / "step-1"
    make_checkpoint(source, {f"shard-{i}.bin": each for i in range(files)}, 1)
    total = each * files
    started = time.perf_counter()
    subprocess.run(["cp", "-r", str(source), str(root / "cp-copy")], check=True)
    cp_s = time.perf_counter() - started
    shutil.rmtree(root / "cp-copy")
    cp_mib_s = rate(total, cp_s)
    print(f"cp -r: {total / MIB:.0f} MiB in {cp_s:.1f} s, {cp_mib_s} MiB/s")
    with s3_server() as server, server_env(server):
        bucket = server.make_bucket("bench")
        store = open_store(bucket + "/restore")  # the agent's settings: 8 MiB parts, 8 at once
        up = upload(store, source)
        print(f"upload_one: {up.seconds:.1f} s, {up.mib_s:.1f} MiB/s")
        done = restore(store, root / "restored")
        assert done is not None and done.fetched_bytes == total
        print(f"restore: {done.seconds:.1f} s, {done.mib_s:.1f} MiB/s")
        empty(store)
    shutil.rmtree(root / "restored")
    shutil.rmtree(root / "source")
    return {
        "size_mib": round(total / MIB),
        "files": files,
        "server": "moto_server on 127.0.0.1 (subprocess, same machine)",
        "store": "optimizer.storage S3, open_store defaults: 8 MiB parts, 8 at a time",
        "cp_r": {"seconds": round(cp_s, 2), "mib_s": cp_mib_s},
        "upload": {
            "seconds": round(up.seconds, 2),
            "mib_s": round(up.mib_s, 1),
            "of_cp": round(up.mib_s / cp_mib_s, 3),
        },
        "restore": {
            "seconds": round(done.seconds, 2),
            "mib_s": round(done.mib_s, 1),
            "of_cp": round(done.mib_s / cp_mib_s, 3),
        },
    }


# -- 2: training steps while an upload runs ----------------------------------------------------


def upload_child(folder: Path, uri: str) -> None:
    """The agent's side, in its own process: wait for "go" on stdin, upload every committed
    folder with the Uploader thread, print the Commits as JSON and exit."""
    store = open_store(uri)
    up = Uploader(store, folder, keep=1, scan_s=3600)
    print("ready", flush=True)
    sys.stdin.readline()
    commits = up.flush(900)
    up.stop()
    print(json.dumps([c.to_data() for c in commits]), flush=True)


def matmul_step(n: int, device: str) -> Any:
    """One step: the product of two n x n float32 matrices on `device`, waited for (as a
    training step that reads its loss is)."""
    import torch

    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)

    def step() -> None:
        torch.mm(a, b)
        if device != "cpu":
            torch.cuda.synchronize()

    return step


def calibrate(target_ms: float, device: str) -> tuple[int, Any]:
    """A matrix size whose product takes about `target_ms` (on one thread on a CPU)."""
    import torch

    torch.set_num_threads(1)
    n = 256 if device == "cpu" else 4096
    for _ in range(6):
        step = matmul_step(n, device)
        step()
        started = time.perf_counter()
        for _ in range(3):
            step()
        took = (time.perf_counter() - started) / 3 * 1000
        n = max(64, int(n * (target_ms / took) ** (1 / 3)))
    return n, matmul_step(n, device)


def percentiles(times: list[float]) -> dict[str, float]:
    ordered = sorted(times)
    at = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {
        "steps": len(times),
        "p50_ms": round(at(0.50) * 1000, 2),
        "p99_ms": round(at(0.99) * 1000, 2),
        "mean_ms": round(statistics.fmean(times) * 1000, 2),
        "max_ms": round(ordered[-1] * 1000, 2),
    }


def run_steps(step: Any, count: int | None, until: threading.Event | None) -> list[float]:
    times: list[float] = []
    while (count is not None and len(times) < count) or (until and not until.is_set()):
        started = time.perf_counter()
        step()
        times.append(time.perf_counter() - started)
    return times


def steps_section(
    root: Path, size: int, repeats: int, base_steps: int, target_ms: float, device: str
) -> dict[str, Any]:
    cpus = sorted(os.sched_getaffinity(0))
    n, step = calibrate(target_ms, device)
    where = "1 CPU thread" if device == "cpu" else f"{device}, synchronized after each"
    out: dict[str, Any] = {
        "upload_mib": round(size / MIB),
        "step": f"torch.mm of two {n}x{n} float32 matrices, {where} (about {target_ms:.0f} ms)",
        "uploader": "a child process: Uploader.flush, open_store defaults (8 MiB parts, 8 at once)",
        "server": "moto_server on 127.0.0.1, same machine",
        "cpus": len(cpus),
        "load_average_1m_before": round(os.getloadavg()[0], 1),
        "modes": {},
    }
    modes = ["shared", "pinned"] if len(cpus) > 1 else ["shared"]
    for mode in modes:
        runs = []
        if mode == "pinned":  # the server and the uploader inherit the other CPUs
            os.sched_setaffinity(0, cpus[1:])
        try:
            with s3_server() as server, server_env(server):
                bucket = server.make_bucket("steps")
                for repeat in range(repeats):
                    runs.append(
                        one_steps_run(root, server, bucket, size, step, base_steps, mode, repeat)
                    )
                    r = runs[-1]
                    print(
                        f"steps {mode} #{repeat + 1}: alone p50 {r['alone']['p50_ms']} p99 "
                        f"{r['alone']['p99_ms']} ms; uploading p50 {r['uploading']['p50_ms']} "
                        f"p99 {r['uploading']['p99_ms']} ms; p99 +{r['p99_slowdown_pct']}%, "
                        f"upload {r['upload_mib_s']} MiB/s"
                    )
        finally:
            os.sched_setaffinity(0, cpus)
        out["modes"][mode] = {
            "how": (
                "steps, uploader and server free to use every CPU"
                if mode == "shared"
                else f"steps on CPU {cpus[0]}; uploader and server on CPUs {cpus[1:]}"
            ),
            "runs": runs,
        }
    return out


def one_steps_run(
    root: Path,
    server: S3Server,
    bucket: str,
    size: int,
    step: Any,
    base_steps: int,
    mode: str,
    repeat: int,
) -> dict[str, Any]:
    cpus = sorted(os.sched_getaffinity(0))
    folder = root / f"steps-{mode}-{repeat}"
    make_checkpoint(folder / "step-1", {"model.pt": size}, 1)
    uri = f"{bucket}/{mode}-{repeat}"
    child = subprocess.Popen(
        [sys.executable, "-m", "bench.checkpoints", "--upload-child", str(folder), uri],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert child.stdin is not None and child.stdout is not None
        assert child.stdout.readline().strip() == "ready", "the upload child did not start"
        if mode == "pinned":
            os.sched_setaffinity(0, cpus[:1])
        try:
            alone = run_steps(step, base_steps, None)
            done = threading.Event()
            result: list[str] = []

            def wait_child() -> None:
                assert child.stdout is not None
                result.append(child.stdout.readline())
                done.set()

            threading.Thread(target=wait_child, daemon=True).start()
            child.stdin.write("go\n")
            child.stdin.flush()
            uploading = run_steps(step, None, done)
        finally:
            os.sched_setaffinity(0, cpus)
        child.wait(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    commits = json.loads(result[0])
    assert commits, "the upload child uploaded nothing"
    shutil.rmtree(folder)
    store = open_store(uri)
    empty(store)
    a, u = percentiles(alone), percentiles(uploading)
    return {
        "alone": a,
        "uploading": u,
        "p50_slowdown_pct": round((u["p50_ms"] / a["p50_ms"] - 1) * 100, 1),
        "p99_slowdown_pct": round((u["p99_ms"] / a["p99_ms"] - 1) * 100, 1),
        "mean_slowdown_pct": round((u["mean_ms"] / a["mean_ms"] - 1) * 100, 1),
        "upload_s": commits[0]["seconds"],
        "upload_mib_s": commits[0]["mib_s"],
        "load_average_1m": round(os.getloadavg()[0], 1),
    }


# -- 3: prefetch, then the final checkpoint ----------------------------------------------------


def prefetch_section(root: Path, file_size: int, files: int) -> dict[str, Any]:
    names = [f"shard-{i}.bin" for i in range(files)]
    local = root / "job"
    make_checkpoint(local / "step-1", dict.fromkeys(names, file_size), 1)
    with s3_server() as server, server_env(server):
        bucket = server.make_bucket("prefetch")
        store = open_store(bucket + "/job")
        upload(store, local / "step-1")
        staged = prefetch(store, root / "next" / "staging")
        assert staged is not None and staged.name == "step-1"
        # The final checkpoint: every file as before but the last one.
        final = local / "step-2"
        final.mkdir()
        for name in names[:-1]:
            shutil.copyfile(local / "step-1" / name, final / name)
        write_random(final / names[-1], file_size)
        commit(final, 2)
        up = upload(store, final)
        manifest_written = time.perf_counter()  # upload_one writes the manifest last
        after = restore(store, root / "next" / "checkpoints", staging=root / "next" / "staging")
        handover_s = time.perf_counter() - manifest_written
        assert after is not None and after.name == "step-2"
        cold = restore(store, root / "cold")
        assert cold is not None and cold.fetched_bytes == after.size_bytes
        # Where the handover's time goes: hashing the staged copies to find the reusable
        # ones, and fetching the changed file alone (one object, not four in parallel).
        started = time.perf_counter()
        for name in names:
            sha256_file(root / "next" / "staging" / "step-1" / name)
        hash_s = time.perf_counter() - started
        started = time.perf_counter()
        store.get_file(f"{data_prefix('step-2')}{names[-1]}", root / "one.bin")
        one_s = time.perf_counter() - started
        empty(store)
    shutil.rmtree(root / "next")
    shutil.rmtree(root / "cold")
    shutil.rmtree(local)
    goal_s = 1.0 + after.fetched_bytes / MIB / cold.mib_s
    one_mib_s = file_size / MIB / one_s
    return {
        "checkpoint_mib": round(files * file_size / MIB),
        "files": files,
        "changed_files": 1,
        "server": "moto_server on 127.0.0.1 (subprocess, same machine)",
        "prefetch_s": round(staged.seconds, 2),
        "final_upload_s": round(up.seconds, 2),
        "manifest_to_restored_s": round(handover_s, 2),
        "fetched_mib": round(after.fetched_bytes / MIB, 1),
        "reused_mib": round(after.reused_bytes / MIB, 1),
        "restore_without_prefetch_s": round(cold.seconds, 2),
        "restore_mib_s": round(cold.mib_s, 1),
        "goal_s": round(goal_s, 2),
        "goal": "1 s + changed bytes / restore_mib_s (issue 29)",
        "meets_goal": handover_s <= goal_s,
        "staged_sha256_s": round(hash_s, 2),  # all staged files, as the restore hashes them
        "one_file_fetch_s": round(one_s, 2),
        "one_file_mib_s": round(one_mib_s, 1),
        "goal_one_file_s": round(1.0 + after.fetched_bytes / MIB / one_mib_s, 2),
    }


# -- the command ---------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--sections",
        nargs="+",
        default=["local", "s3", "steps", "prefetch"],
        choices=["local", "s3", "steps", "prefetch"],
    )
    parser.add_argument("--mib", type=int, default=256, help="local: size of one checkpoint")
    parser.add_argument("--gib", type=float, default=4, help="s3: size of the checkpoint")
    parser.add_argument("--files", type=int, default=4, help="s3: files it is made of")
    parser.add_argument("--steps-mib", type=int, default=1024, help="steps: upload size")
    parser.add_argument("--repeats", type=int, default=3, help="steps: runs of each mode")
    parser.add_argument("--base-steps", type=int, default=300, help="steps: steps alone")
    parser.add_argument("--step-ms", type=float, default=30, help="steps: one step's time")
    parser.add_argument("--step-device", default="cpu", help="steps: cpu, or cuda for a GPU")
    parser.add_argument("--prefetch-mib", type=int, default=256, help="prefetch: one file")
    parser.add_argument("--prefetch-files", type=int, default=4, help="prefetch: files")
    parser.add_argument("--quick", action="store_true", help="small sizes; writes nothing")
    parser.add_argument("--out", type=Path, default=None, help=f"default {RESULTS}")
    parser.add_argument("--upload-child", nargs=2, metavar=("DIR", "URI"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.upload_child:
        upload_child(Path(args.upload_child[0]), args.upload_child[1])
        return
    if args.quick:
        args.mib, args.gib, args.files, args.steps_mib = 16, 1 / 16, 4, 64
        args.repeats, args.base_steps, args.step_ms = 1, 30, 20
        args.prefetch_mib, args.prefetch_files = 8, 4
    out = args.out or (None if args.quick else RESULTS)
    figures: dict[str, Any] = {}  # the sections run now; the file's others are kept
    measured_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    with tempfile.TemporaryDirectory(prefix="gpuopt-bench-ckpt-") as tmp:
        root = Path(tmp)
        if "local" in args.sections:
            local = local_section(args.mib)
            figures.update(local)
            for key, value in local.items():
                print(f"{key:40} {value}")
        if "s3" in args.sections:
            figures["s3_restore"] = {
                "measured_at": measured_at,
                **s3_restore_section(root, int(args.gib * 1024) * MIB, args.files),
            }
        if "steps" in args.sections:
            key = "steps_during_upload" + ("" if args.step_device == "cpu" else "_gpu")
            figures[key] = {
                "measured_at": measured_at,
                **steps_section(
                    root,
                    args.steps_mib * MIB,
                    args.repeats,
                    args.base_steps,
                    args.step_ms,
                    args.step_device,
                ),
            }
        if "prefetch" in args.sections:
            section = prefetch_section(root, args.prefetch_mib * MIB, args.prefetch_files)
            figures["s3_prefetch"] = {"measured_at": measured_at, **section}
            for key, value in section.items():
                print(f"prefetch {key:30} {value}")
    if out:
        kept = json.loads(out.read_text()) if out.exists() else {}
        out.write_text(json.dumps({**kept, **figures}, indent=1) + "\n")
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
