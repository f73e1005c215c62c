"""Random access figures: `ds[i]` latency (p50/p99), batched random access (rows/s, 256
random indices per call, as a torch sampler sends them) and the time to build the record
index per GB, for Parquet, JSONL and TFRecord, on local disk and over S3 (a local
SeaweedFS that the bench starts and stops itself); HF `datasets`' map-style Dataset (its
memory-mapped Arrow cache) beside them for Parquet and JSONL, locally.

    python benches/random_access.py [--rows 400000] [--shards 8] [--where local,s3]
"""

from __future__ import annotations

import argparse
import json
import shutil
import struct
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import shardflow as sf


def write(root: Path, rows: int, shards: int) -> dict[str, list[str]]:
    rng = np.random.default_rng(0)
    per = rows // shards
    out: dict[str, list[str]] = {"parquet": [], "jsonl": [], "tfrecord": []}
    sys_path = Path(__file__).resolve().parent.parent / "tests"
    import sys

    sys.path.insert(0, str(sys_path))
    from test_fork_remote import write_tfrecord  # the tests' TFRecord framing writer

    for s in range(shards):
        ids = np.arange(s * per, (s + 1) * per)
        text = [f"sample {i} " + "x" * int(rng.integers(50, 400)) for i in ids]
        table = pa.table({"id": ids, "text": text})
        p = root / f"part-{s:03d}.parquet"
        pq.write_table(table, p, row_group_size=10_000)
        out["parquet"].append(str(p))
        records = [json.dumps({"id": int(i), "text": t}) for i, t in zip(ids, text)]
        j = root / f"part-{s:03d}.jsonl"
        j.write_text("\n".join(records) + "\n")
        out["jsonl"].append(str(j))
        t = root / f"part-{s:03d}.tfrecord"
        write_tfrecord(t, [r.encode() for r in records])
        out["tfrecord"].append(str(t))
    return out


def open_ds(fmt: str, paths: list[str], storage_options: dict | None = None) -> sf.Dataset:
    if fmt == "tfrecord":
        return sf.dataset(paths, format="tfrecord", format_options={"raw": True}, storage_options=storage_options)
    return sf.dataset(paths, storage_options=storage_options)


def access_times(get_one, get_many, n: int, rng: np.random.Generator) -> tuple[float, float, float]:  # noqa: ANN001
    """`ds[i]` p50 and p99 (ms) over 500 random rows, then rows/s over 40 calls of 256
    random indices."""
    lat = []
    for i in rng.integers(0, n, 500):
        t0 = time.perf_counter()
        get_one(int(i))
        lat.append(time.perf_counter() - t0)
    lat_ms = np.array(lat) * 1e3
    batches = [rng.integers(0, n, 256).tolist() for _ in range(40)]
    t0 = time.perf_counter()
    for b in batches:
        get_many(b)
    rate = 256 * len(batches) / (time.perf_counter() - t0)
    return float(np.median(lat_ms)), float(np.percentile(lat_ms, 99)), rate


def measure(where: str, fmt: str, paths: list[str], size: int, storage_options: dict | None, rng: np.random.Generator) -> None:
    ds = open_ds(fmt, paths, storage_options)
    t0 = time.perf_counter()
    n = ds.index()
    build = time.perf_counter() - t0
    ds = open_ds(fmt, paths, storage_options)  # a fresh dataset: the index comes from memory/disk
    p50, p99, rate = access_times(ds.__getitem__, ds.__getitems__, n, rng)
    per_gb = build / (size / 1e9) if fmt != "parquet" else float("nan")
    print(
        f"| {where} | {fmt} | {build:.3f} s ({size / 1e6:.0f} MB) | {per_gb:.2f} | "
        f"{p50:.2f} ms | {p99:.2f} ms | {rate:,.0f} |",
        flush=True,
    )


def measure_hf(fmt: str, paths: list[str], cache: Path, rng: np.random.Generator) -> None:
    """HF `datasets`' map-style Dataset (its Arrow cache, memory-mapped) on the same files."""
    from datasets import disable_progress_bars, load_dataset

    disable_progress_bars()
    builder = "json" if fmt == "jsonl" else fmt
    t0 = time.perf_counter()
    ds = load_dataset(builder, data_files=paths, split="train", cache_dir=str(cache))
    build = time.perf_counter() - t0
    p50, p99, rate = access_times(ds.__getitem__, ds.__getitem__, len(ds), rng)
    print(
        f"| local, HF datasets | {fmt} | {build:.3f} s (to its Arrow cache) | | "
        f"{p50:.2f} ms | {p99:.2f} ms | {rate:,.0f} |",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=400_000)
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--where", default="local,s3")
    args = ap.parse_args()
    where = args.where.split(",")
    root = Path(tempfile.mkdtemp(prefix="sf-ra-"))
    server = None
    try:
        files = write(root, args.rows, args.shards)
        rng = np.random.default_rng(1)
        print(f"{args.rows} rows in {args.shards} shards")
        print("| where | format | index build | index s/GB | ds[i] p50 | ds[i] p99 | batched random rows/s |")
        print("|---|---|---|---|---|---|---|")
        if "local" in where:
            for fmt, paths in files.items():
                for p in root.glob(".*.sfindex"):
                    p.unlink()
                size = sum(Path(p).stat().st_size for p in paths)
                measure("local", fmt, paths, size, None, rng)
                if fmt in ("parquet", "jsonl"):
                    measure_hf(fmt, paths, root / "hf-cache", rng)
        if "s3" in where:
            import sys

            sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
            from servers import Seaweed

            for p in root.glob(".*.sfindex"):
                p.unlink()
            (root / "weed").mkdir()
            server = Seaweed(root / "weed")
            client = server.client()
            client.create_bucket(Bucket="bench")
            for fmt, paths in files.items():
                for p in paths:
                    client.upload_file(p, "bench", Path(p).name)
                urls = [f"s3://bench/{Path(p).name}" for p in paths]
                size = sum(Path(p).stat().st_size for p in paths)
                measure("s3", fmt, urls, size, server.storage_options(), rng)
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
