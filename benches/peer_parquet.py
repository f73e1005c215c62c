"""Side by side, in one run: an epoch over the same Parquet file with shardflow and with
pyarrow (``ParquetFile.iter_batches`` + ``to_numpy``), both ending in numpy batches.

    python benches/peer_parquet.py [--rows 1000000] [--repeats 7]

Prints the median rows/s and MB/s (file bytes / time) of each and their ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import shardflow as sf


def write(path: str, rows: int) -> None:
    ids = np.arange(rows, dtype=np.int64)
    table = pa.table(
        {
            "id": ids,
            "score": (ids % 1000 / 7).astype(np.float32),
            "text": pa.array([f"sample text number {i}" for i in range(rows)]),
            "embedding": pa.FixedSizeListArray.from_arrays(pa.array((np.arange(rows * 16) % 97).astype(np.float32)), 16),
        }
    )
    pq.write_table(table, path, row_group_size=100_000, compression="snappy")


def shardflow_epoch(path: str, batch_size: int) -> int:
    rows = 0
    for batch in sf.DataLoader(sf.dataset(path), batch_size=batch_size):
        rows += len(batch["id"])
    return rows


def pyarrow_epoch(path: str, batch_size: int) -> int:
    rows = 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=batch_size):
        columns = {}
        for name, column in zip(batch.schema.names, batch.columns):
            if isinstance(column, pa.FixedSizeListArray):
                columns[name] = column.flatten().to_numpy().reshape(len(column), -1)
            else:
                columns[name] = column.to_numpy(zero_copy_only=False)
        rows += len(columns["id"])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "peer.parquet")
        write(path, args.rows)
        size_mb = os.path.getsize(path) / 1e6
        print(f"file: {args.rows:,} rows, {size_mb:.1f} MB (snappy), batch_size={args.batch_size}, cpus={os.cpu_count()}")
        runners = {"shardflow": shardflow_epoch, "pyarrow iter_batches+to_numpy": pyarrow_epoch}
        times: dict[str, list[float]] = {name: [] for name in runners}
        for _ in range(args.repeats):
            for name, run in runners.items():  # interleaved, so drift hits both alike
                start = time.perf_counter()
                assert run(path, args.batch_size) == args.rows
                times[name].append(time.perf_counter() - start)
        medians = {name: statistics.median(t) for name, t in times.items()}
        for name, median in medians.items():
            print(
                f"{name:32s} median {median * 1000:7.1f} ms  {args.rows / median / 1e6:6.2f} M rows/s"
                f"  {size_mb / median:7.1f} MB/s"
            )
        base = medians["pyarrow iter_batches+to_numpy"]
        print(f"shardflow / pyarrow speed ratio: {base / medians['shardflow']:.2f}x")


if __name__ == "__main__":
    main()
