"""Ray Data: rows/s of `shardflow.ray.read` against `ray.data.read_parquet` on the same
Parquet files, on a local Ray runtime (`ray.init(num_cpus=2)`), in one run. Each pass
materialises nothing: it iterates every block through `iter_batches`. Medians of
`--repeat` passes, after one warm-up pass each.

    python benches/peer_ray.py [--rows 2000000] [--files 8] [--repeat 5]

Needs `pip install "ray[data]" aiohttp` (Ray's read_parquet imports fsspec's HTTP
filesystem, which needs aiohttp, even for local paths).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import ray

import shardflow.ray


def write(root: Path, rows: int, files: int) -> list[str]:
    rng = np.random.default_rng(0)
    per = rows // files
    paths = []
    for f in range(files):
        ids = np.arange(f * per, (f + 1) * per)
        table = pa.table({
            "id": ids,
            "x": rng.standard_normal(per).astype(np.float32),
            "label": rng.integers(0, 1000, per),
            "text": pa.array([f"sample {i}" for i in ids]),
        })
        path = root / f"part-{f:03d}.parquet"
        pq.write_table(table, path, row_group_size=100_000)
        paths.append(str(path))
    return paths


def rows_per_second(make, repeat: int) -> float:  # noqa: ANN001
    def one() -> float:
        start = time.perf_counter()
        rows = sum(len(b["id"]) for b in make().iter_batches(batch_size=8192, batch_format="pyarrow"))
        return rows / (time.perf_counter() - start)

    one()
    return statistics.median(one() for _ in range(repeat))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="sf-ray-"))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    try:
        paths = write(root, args.rows, args.files)
        ours = rows_per_second(lambda: shardflow.ray.read(paths), args.repeat)
        theirs = rows_per_second(lambda: ray.data.read_parquet(paths), args.repeat)
        print(f"{args.rows} rows in {args.files} Parquet files, 4 columns; medians of {args.repeat}")
        print("| reader | rows/s |")
        print("|---|---|")
        print(f"| shardflow.ray.read | {ours:,.0f} |")
        print(f"| ray.data.read_parquet | {theirs:,.0f} |")
        print(f"ratio: {ours / theirs:.2f}x")
    finally:
        ray.shutdown()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
