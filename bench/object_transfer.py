"""Moving one large file through object storage on this machine: `cp` of the same bytes on
the same disk (the ceiling), then an upload and a download through optimizer.storage's S3
backend (boto3) to a moto_server on loopback, with the default concurrency and with more,
and through `obstore` (Rust object_store) when it is installed. Prints MiB/s and the ratio
to cp; writes bench/results/object_transfer.json.

The server is part of what is measured: moto keeps each object in a temporary file, joins a
multipart upload in memory, and reads the whole object for every ranged GET, so these
figures compare clients against one slow server, not against S3.

    python bench/object_transfer.py [--size-mib 4096] [--part-mib 8] [--concurrency 8 32]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

if not __package__:
    # Run as a file: the tests' helpers (the moto_server subprocess) are the package
    # `tests.helpers` of the repository root, so run as the module bench.object_transfer.
    os.chdir(ROOT)
    os.execv(sys.executable, [sys.executable, "-m", "bench.object_transfer", *sys.argv[1:]])

from optimizer.storage import StorageError, open_store  # noqa: E402
from tests.helpers.objstore import s3_server  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "object_transfer.json"
MIB = 1 << 20
BLOCK = 16 * MIB


def write_random(path: Path, size: int) -> str:
    """`size` random bytes into `path`; returns their sha256."""
    digest = hashlib.sha256()
    with path.open("wb") as out:
        left = size
        while left:
            block = os.urandom(min(BLOCK, left))
            digest.update(block)
            out.write(block)
            left -= len(block)
    return digest.hexdigest()


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as source:
        while block := source.read(BLOCK):
            digest.update(block)
    return digest.hexdigest()


def timed(call: Callable[[], object]) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def rate(size: int, seconds: float, ceiling: float | None = None) -> dict[str, float]:
    mib_s = size / MIB / seconds
    row = {"seconds": round(seconds, 2), "mib_s": round(mib_s, 1)}
    if ceiling:
        row["of_cp"] = round(mib_s / ceiling, 3)
    return row


def obstore_rows(
    endpoint: str, bucket: str, source: Path, target: Path, size: int, part: int, cp: float
) -> dict[str, Any]:
    import obstore
    from obstore.store import S3Store

    store = S3Store(
        bucket,
        endpoint=endpoint,
        region="us-east-1",
        access_key_id="testing",
        secret_access_key="testing",
        client_options={"allow_http": True},
    )

    def download() -> None:
        with target.open("wb") as out:
            for chunk in obstore.get(store, "obstore.bin").stream(min_chunk_size=part):
                out.write(chunk)

    up = timed(lambda: obstore.put(store, "obstore.bin", source, chunk_size=part))
    down = timed(download)
    assert sha256(target) == sha256(source), "obstore download differs"
    target.unlink()
    obstore.delete(store, "obstore.bin")
    return {
        "version": obstore.__version__,
        "upload": rate(size, up, cp),
        "download": rate(size, down, cp),
        "how": "put (multipart, 12 parts at a time) and one streamed GET",
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size-mib", type=int, default=4096)
    parser.add_argument("--part-mib", type=int, default=8)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--dir", type=Path, default=None, help="where the files go")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    size = args.size_mib * MIB
    figures: dict[str, Any] = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "size_mib": args.size_mib,
        "part_mib": args.part_mib,
        "server": "moto_server on 127.0.0.1 (subprocess)",
    }
    with tempfile.TemporaryDirectory(prefix="gpuopt-bench-obj-", dir=args.dir) as tmp:
        work = Path(tmp)
        source, target = work / "source.bin", work / "target.bin"
        digest = write_random(source, size)
        cp = timed(lambda: subprocess.run(["cp", str(source), str(target)], check=True))
        target.unlink()
        cp_mib_s = size / MIB / cp
        figures["cp"] = rate(size, cp)
        print(f"cp: {cp_mib_s:.0f} MiB/s ({cp:.1f} s for {args.size_mib} MiB)")
        with s3_server() as server:
            os.environ.update(server.env)
            bucket = server.make_bucket("bench")
            for concurrency in args.concurrency:
                store = open_store(
                    bucket, part_mib=args.part_mib, concurrency=concurrency, retries=0
                )
                try:
                    up = timed(lambda store=store: store.put_file("boto3.bin", source))
                    down = timed(lambda store=store: store.get_file("boto3.bin", target))
                except StorageError as error:
                    figures[f"boto3_concurrency_{concurrency}"] = {"error": str(error)}
                    print(f"optimizer.storage S3 (boto3), {concurrency} at a time: {error}")
                    store.delete(["boto3.bin"])
                    continue
                assert sha256(target) == digest, "download differs from the upload"
                target.unlink()
                store.delete(["boto3.bin"])
                row = {"upload": rate(size, up, cp_mib_s), "download": rate(size, down, cp_mib_s)}
                figures[f"boto3_concurrency_{concurrency}"] = row
                print(
                    f"optimizer.storage S3 (boto3), {concurrency} parts at a time: upload "
                    f"{row['upload']['mib_s']} MiB/s ({row['upload']['of_cp']} of cp), "
                    f"download {row['download']['mib_s']} MiB/s ({row['download']['of_cp']} of cp)"
                )
            try:
                import obstore  # noqa: F401
            except ImportError:
                figures["obstore"] = None
                print("obstore: not installed, skipped")
            else:
                row = obstore_rows(
                    server.endpoint, "bench", source, target, size, args.part_mib * MIB, cp_mib_s
                )
                figures["obstore"] = row
                print(
                    f"obstore {row['version']}: upload {row['upload']['mib_s']} MiB/s "
                    f"({row['upload']['of_cp']} of cp), download {row['download']['mib_s']} "
                    f"MiB/s ({row['download']['of_cp']} of cp)"
                )
        shutil.rmtree(work, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
