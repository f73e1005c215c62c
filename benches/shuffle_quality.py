"""How well each shuffle mixes, against the exact uniform permutation: the exact
``ds.shuffle(seed)`` and the streaming ``ds.shuffle(seed, buffer_size=B)`` (seeded
row-group order plus a B-row buffer, also bounded by ``buffer_bytes``), on the same data.

    python benches/full_shuffle.py            # their time and memory
    python benches/shuffle_quality.py [--rows 6000] [--row-kb 256] [--buffers 1000 10000]

Data: issue 30's setup (ROWS rows of ROW_KB random bytes, 10 Parquet files, row groups of
100 rows). Each order is one epoch of ``DataLoader(ds, batch_size=32)``. For each:

- neighbours: rows next to each other in the files (i, i+1), how far apart the shuffle
  puts them: the median distance (as a share of the rows; about 0.29 for a uniform
  permutation) and the share that land within one batch (32 rows) of each other;
- batches: the mean number of row groups the rows of a batch of 32 come from, and the most
  rows one row group gives a batch (what the model sees as correlated samples);
- and, as a baseline, the same figures for numpy's uniform permutation.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

from memory_rss import write

BATCH = 32
GROUP = 100  # rows per row group, as memory_rss.write writes them


def measures(order: np.ndarray) -> tuple[float, float, float, int]:
    n = len(order)
    position = np.empty(n, dtype=np.int64)
    position[order] = np.arange(n)
    gap = np.abs(np.diff(position))
    groups = order // GROUP
    per_batch = [np.unique(groups[s:s + BATCH], return_counts=True) for s in range(0, n - BATCH + 1, BATCH)]
    distinct = float(np.mean([len(u) for u, _ in per_batch]))
    most = int(max(c.max() for _, c in per_batch))
    return float(np.median(gap)) / n, float(np.mean(gap <= BATCH)), distinct, most


def epoch(source: str, buffer: int | None) -> np.ndarray:
    import shardflow as sf

    ds = sf.dataset(source)
    ds = ds.shuffle(seed=0) if buffer is None else ds.shuffle(seed=0, buffer_size=buffer)
    return np.concatenate([b["id"] for b in sf.DataLoader(ds, batch_size=BATCH)])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=6000)
    parser.add_argument("--row-kb", type=int, default=256)
    parser.add_argument("--buffers", type=int, nargs="+", default=[1000, 10_000])
    args = parser.parse_args()
    print(f"{args.rows:,} rows of {args.row_kb} KB, row groups of {GROUP}, batches of {BATCH}")
    print("| order | neighbours: median distance / rows | neighbours within a batch | row groups per batch | most rows of one row group in a batch |")
    print("|---|---|---|---|---|")

    def line(name: str, order: np.ndarray) -> None:
        assert sorted(order.tolist()) == list(range(args.rows))
        median, near, distinct, most = measures(order)
        print(f"| {name} | {median:.3f} | {near:.4f} | {distinct:.1f} | {most} |", flush=True)

    line("numpy permutation (uniform)", np.random.default_rng(0).permutation(args.rows))
    with tempfile.TemporaryDirectory() as tmp:
        source = write(Path(tmp), args.rows, args.row_kb)
        line("`shuffle(seed)` (exact)", epoch(source, None))
        for buffer in args.buffers:
            line(f"`shuffle(seed, buffer_size={buffer:,})`", epoch(source, buffer))


if __name__ == "__main__":
    main()
