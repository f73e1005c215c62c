"""Command line: ``python -m shardflow demo | inspect PATH | bench PATH``."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Any

import numpy as np

import shardflow as sf
from shardflow import _native


def _write_demo_data(directory: str, rows: int, shards: int) -> tuple[str, str]:
    """Writes the same synthetic image-classification table as Parquet shards and as
    gzipped JSON Lines; returns the two glob patterns."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        sys.exit("the demo writes its Parquet files with pyarrow: pip install 'shardflow[arrow]'")
    rng = np.random.default_rng(0)
    per_shard = -(-rows // shards)
    for shard in range(shards):
        start = shard * per_shard
        n = max(0, min(per_shard, rows - start))
        pixels = rng.integers(0, 256, size=(n, 28 * 28), dtype=np.uint8)
        table = pa.table(
            {
                "id": np.arange(start, start + n, dtype=np.int64),
                "image": pa.FixedSizeListArray.from_arrays(pa.array(pixels.ravel()), 28 * 28),
                "label": rng.integers(0, 10, size=n, dtype=np.int64),
                "caption": [f"sample {i}" for i in range(start, start + n)],
            }
        )
        pq.write_table(table, os.path.join(directory, f"train-{shard:03d}.parquet"), row_group_size=8192)
    import gzip

    with gzip.open(os.path.join(directory, "meta-000.jsonl.gz"), "wt") as f:
        for i in range(min(rows, 20_000)):
            f.write(json.dumps({"id": i, "tags": ["a", "b"][: i % 3], "score": i / 7}) + "\n")
    return (
        os.path.join(directory, f"train-{{000..{shards - 1:03d}}}.parquet"),
        os.path.join(directory, "meta-*.jsonl.gz"),
    )


def _run_epoch(loader: sf.DataLoader) -> tuple[int, float, dict[str, float]]:
    """Runs one epoch; returns rows, seconds and the stats counters it added."""
    before = loader.stats()
    start = time.perf_counter()
    rows = 0
    for batch in loader:
        rows += batch.num_rows
    seconds = time.perf_counter() - start
    after = loader.stats()
    return rows, seconds, {k: after[k] - before[k] for k in after}


def _report(name: str, rows: int, seconds: float, stats: dict[str, Any]) -> None:
    mb = stats["bytes_read"] / 1e6
    print(
        f"{name}: {rows:,} samples in {seconds:.2f} s = {rows / seconds:,.0f} samples/s, "
        f"{mb / seconds:,.1f} MB/s read ({mb:.1f} MB, {stats['files_opened']} files); "
        f"waited {stats['wait_seconds']:.2f} s, decoded {stats['decode_seconds']:.2f} s (all threads)"
    )


def demo(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="shardflow-demo-") as directory:
        print(f"writing {args.rows:,} rows into {args.shards} Parquet shards under {directory} ...")
        parquet, jsonl = _write_demo_data(directory, args.rows, args.shards)
        ds = sf.dataset(parquet)
        print(f"dataset: {ds.format}, {len(ds.shards)} shards, {len(ds):,} rows, columns {ds.column_names}")
        loader = sf.DataLoader(ds, batch_size=args.batch_size, shuffle=True, seed=0, drop_last=False)
        for epoch in range(args.epochs):
            loader.set_epoch(epoch)
            _report(f"epoch {epoch} (shuffled, batch_size={args.batch_size})", *_run_epoch(loader))
        first = next(iter(sf.DataLoader(ds, batch_size=4, shuffle=True, seed=0)))
        print("a batch:", {k: (v.dtype, v.shape) for k, v in first.items()})
        print("labels:", first["label"].tolist(), "captions:", first["caption"].tolist())
        meta = sf.dataset(jsonl)
        meta_loader = sf.DataLoader(meta, batch_size=1024)
        _report("JSON Lines (gzip)", *_run_epoch(meta_loader))
        print("a JSON record:", next(iter(meta.skip(2))))


def inspect(args: argparse.Namespace) -> None:
    ds = sf.dataset(args.source, args.format)
    print(f"format:  {ds.format}")
    first, last = (_native._redact(url) for url in (ds.shards[0], ds.shards[-1]))
    print(f"shards:  {len(ds.shards)} ({first} ... {last})")
    print(f"columns: {ds.column_names}")
    try:
        print(f"rows:    {len(ds):,}")
    except TypeError:
        print("rows:    unknown without reading")
    for i, sample in enumerate(ds.take(args.head)):
        print(f"[{i}]", {k: (v if not isinstance(v, (bytes, str)) or len(v) < 60 else v[:60]) for k, v in sample.items()})


def bench(args: argparse.Namespace) -> None:
    ds = sf.dataset(args.source, args.format, columns=args.columns)
    loader = sf.DataLoader(
        ds, batch_size=args.batch_size, shuffle=args.shuffle, num_threads=args.threads, output=args.output
    )
    times = []
    for epoch in range(args.epochs):
        loader.set_epoch(epoch)
        rows, seconds, added = _run_epoch(loader)
        times.append(seconds)
        _report(f"epoch {epoch}", rows, seconds, added)
    print(f"median: {sorted(times)[len(times) // 2]:.3f} s per epoch")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m shardflow", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("demo", help="write a small dataset to a temporary directory and stream it")
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--shards", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--epochs", type=int, default=2)
    p.set_defaults(func=demo)
    p = sub.add_parser("inspect", help="show a dataset's shards, columns and first samples")
    p.add_argument("source", nargs="+", help="paths, globs, brace ranges or URLs")
    p.add_argument("--format")
    p.add_argument("--head", type=int, default=3)
    p.set_defaults(func=inspect)
    p = sub.add_parser("bench", help="time epochs over a dataset")
    p.add_argument("source", nargs="+", help="paths, globs, brace ranges or URLs")
    p.add_argument("--format")
    p.add_argument("--columns", nargs="*")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--threads", type=int)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--shuffle", action="store_true")
    p.add_argument("--output", choices=["numpy", "arrow"], default="arrow")
    p.set_defaults(func=bench)
    args = parser.parse_args(argv)
    try:
        args.func(args)
    except sf.ShardflowError as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    main()
