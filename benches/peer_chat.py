"""The chat fine-tuning workload, side by side in one run: JSONL shards of
``messages: list<struct<role, content>>`` rows, half of them gzipped, shuffled with a
10,000-row buffer and read in batches of 256.

    python benches/peer_chat.py [--shards 16] [--rows-per-shard 10000] [--repeats 3]

- ``shardflow numpy``: ``sf.dataset(glob).shuffle(seed, buffer_size=10_000)`` through
  ``DataLoader(batch_size=256)`` (nested columns come out as object arrays of records);
- ``shardflow arrow+to_pylist``: the same with ``output="arrow"`` and ``to_pylist()``;
- ``datasets streaming``: ``load_dataset("json", streaming=True).shuffle(seed,
  buffer_size=10_000).batch(256)`` (Hugging Face ``datasets``).
Loaders alternate; the median of the repeats is reported, with the ratio to ``datasets``.
"""

from __future__ import annotations

import argparse
import gc
import gzip
import json
import os
import statistics
import tempfile
import time

from nested import chat_rows

import shardflow as sf

BATCH = 256
BUFFER = 10_000
SEED = 7


def write_shards(directory: str, shards: int, rows_per_shard: int) -> list[str]:
    rows = chat_rows(shards * rows_per_shard)
    paths = []
    for s in range(shards):
        # Half the shards gzipped, as chat datasets on the Hub often are.
        name = f"chat-{s:05d}.jsonl" + (".gz" if s % 2 else "")
        path = os.path.join(directory, name)
        opener = gzip.open if name.endswith(".gz") else open
        with opener(path, "wt") as f:
            for row in rows[s * rows_per_shard : (s + 1) * rows_per_shard]:
                f.write(json.dumps(row) + "\n")
        paths.append(path)
    return paths


def shardflow_numpy(paths: list[str]) -> int:
    rows = 0
    ds = sf.dataset(paths).shuffle(SEED, buffer_size=BUFFER)
    for batch in sf.DataLoader(ds, batch_size=BATCH):
        rows += len(batch["messages"])
    return rows


def shardflow_arrow(paths: list[str]) -> int:
    rows = 0
    ds = sf.dataset(paths).shuffle(SEED, buffer_size=BUFFER)
    for batch in sf.DataLoader(ds, batch_size=BATCH, output="arrow"):
        rows += len(batch.to_pylist())
    return rows


def datasets_streaming(paths: list[str]) -> int:
    from datasets import load_dataset

    ds = load_dataset("json", data_files=paths, split="train", streaming=True)
    rows = 0
    for batch in ds.shuffle(seed=SEED, buffer_size=BUFFER).batch(BATCH):
        rows += len(batch["messages"])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--rows-per-shard", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    total = args.shards * args.rows_per_shard
    runners = {"shardflow numpy": shardflow_numpy, "shardflow arrow+to_pylist": shardflow_arrow, "datasets streaming": datasets_streaming}
    with tempfile.TemporaryDirectory() as directory:
        paths = write_shards(directory, args.shards, args.rows_per_shard)
        gc.collect()
        size_mb = sum(os.path.getsize(p) for p in paths) / 1e6
        print(f"{args.shards} shards, {total:,} chat rows, {size_mb:.0f} MB on disk (half gzip), shuffle buffer {BUFFER:,}, batch {BATCH}, cpus={os.cpu_count()}")
        times: dict[str, list[float]] = {name: [] for name in runners}
        for _ in range(args.repeats):
            for name, run in runners.items():  # interleaved, so drift hits all alike
                start = time.perf_counter()
                assert run(paths) == total, name
                times[name].append(time.perf_counter() - start)
        reference = statistics.median(times["datasets streaming"])
        for name in runners:
            median = statistics.median(times[name])
            print(f"{name:28s} median {median:6.2f} s  {total / median / 1e3:7.1f}k rows/s  {reference / median:5.1f}x datasets")


if __name__ == "__main__":
    main()
