"""The cost of the PyTorch adapter, in one run on the same Parquet data (60,000 rows of
a 28x28 uint8 image and a label, as Fashion-MNIST): samples/s of

- shardflow alone (DataLoader, output="torch"),
- torch.utils.data.DataLoader over shardflow.torch.IterableDataset, shardflow batching
  (batch_size=None), with 0 and 2 workers,
- the same with torch collating samples (batch_size=256), 2 workers,
- torch.utils.data.DataLoader over shardflow.torch.MapDataset with a RandomSampler,
- a Python ``map`` per sample (pure Python work, under the GIL) with 0 and 2 workers.

    python benches/peer_torch.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch.utils.data import DataLoader as TorchLoader

import shardflow as sf
from shardflow.torch import IterableDataset, MapDataset

ROWS = 60_000
BATCH = 256


def write(directory: str) -> str:
    rng = np.random.default_rng(0)
    for part in range(4):
        n = ROWS // 4
        images = pa.array(rng.integers(0, 255, n * 784, dtype=np.uint8))
        table = pa.table({"image": pa.FixedSizeListArray.from_arrays(images, 784), "label": rng.integers(0, 10, n)})
        pq.write_table(table, os.path.join(directory, f"train-{part}.parquet"), row_group_size=5000)
    return os.path.join(directory, "train-*.parquet")


def python_work(row: dict) -> dict:
    """About 15 us of pure Python per sample, like a small tokenizer or augmentation."""
    pixels = row["image"][:256].tolist()
    return {"label": row["label"], "brightness": sum(p * p for p in pixels) / len(pixels)}


def count(batches) -> int:  # noqa: ANN001
    return sum(len(b["label"]) for b in batches)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as d:
        pattern = write(d)
        ds = sf.dataset(pattern)
        runners: dict[str, Callable[[], int]] = {
            "shardflow alone": lambda: count(sf.DataLoader(ds, batch_size=BATCH, shuffle=True, seed=0, output="torch")),
            "torch DataLoader, 0 workers": lambda: count(
                TorchLoader(IterableDataset(ds, batch_size=BATCH, shuffle=True), batch_size=None)
            ),
            "torch DataLoader, 2 workers": lambda: count(
                TorchLoader(IterableDataset(ds, batch_size=BATCH, shuffle=True), batch_size=None, num_workers=2,
                            multiprocessing_context="fork")
            ),
            "torch collating samples, 2 workers": lambda: count(
                TorchLoader(IterableDataset(ds, shuffle=True), batch_size=BATCH, num_workers=2, multiprocessing_context="fork")
            ),
            "MapDataset + RandomSampler, 0 workers": lambda: count(TorchLoader(MapDataset(ds), batch_size=BATCH, shuffle=True)),
            # Python work per sample, which holds the GIL: here workers pay off.
            "Python map per sample, 0 workers": lambda: count(
                TorchLoader(IterableDataset(ds.map(python_work), batch_size=BATCH, shuffle=True), batch_size=None)
            ),
            "Python map per sample, 2 workers": lambda: count(
                TorchLoader(IterableDataset(ds.map(python_work), batch_size=BATCH, shuffle=True), batch_size=None,
                            num_workers=2, multiprocessing_context="fork")
            ),
        }
        times: dict[str, list[float]] = {name: [] for name in runners}
        for _ in range(args.repeats):
            for name, run in runners.items():
                start = time.perf_counter()
                assert run() == ROWS, name
                times[name].append(time.perf_counter() - start)
        print(f"{ROWS:,} samples of 784 bytes + label, batch {BATCH}, cpus={os.cpu_count()}, torch {torch.__version__}, "
              f"medians of {args.repeats}")
        base = statistics.median(times["shardflow alone"])
        for name, t in times.items():
            median = statistics.median(t)
            print(f"  {name:40s} {median * 1000:8.1f} ms  {ROWS / median:12,.0f} samples/s  {base / median:5.2f}x of alone")


if __name__ == "__main__":
    main()
