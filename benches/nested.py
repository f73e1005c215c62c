"""Nested (chat) columns, by rows per row group or file: shardflow's numpy and arrow
outputs against pyarrow's own conversion of the same batches, in one run.

    python benches/nested.py [--rows 160000] [--group-rows 5000,20000,80000] [--repeats 3]

Each row has ``messages: list<struct<role, content>>`` and ``tags: list<string>``.
Rows are read unshuffled at batch 256 and converted to Python objects:
- ``shardflow numpy``: ``DataLoader(output="numpy")`` (nested columns come out as object arrays);
- ``shardflow arrow+to_pylist``: ``DataLoader(output="arrow")``, then ``to_pylist()``;
- ``pyarrow``: ``ParquetFile.iter_batches`` / ``pyarrow.json.read_json``, then ``to_pylist()``.
The per-batch cost should not depend on the row-group size.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import tempfile
import time

import pyarrow as pa
import pyarrow.json as pj
import pyarrow.parquet as pq

import shardflow as sf

BATCH = 256


def chat_rows(rows: int) -> list[dict]:
    out = []
    for i in range(rows):
        turns = 2 + i % 5
        out.append(
            {
                "id": i,
                "messages": [
                    {"role": "user" if t % 2 == 0 else "assistant", "content": f"turn {t} of chat {i}: " + "lorem ipsum " * (1 + (i + t) % 8)}
                    for t in range(turns)
                ],
                "tags": [f"tag{(i * 7 + k) % 50}" for k in range(i % 4)],
            }
        )
    return out


def write(directory: str, rows: list[dict], group_rows: int) -> dict[str, str]:
    table = pa.Table.from_pylist(rows)
    parquet = os.path.join(directory, f"chat-{group_rows}.parquet")
    pq.write_table(table, parquet, row_group_size=group_rows)
    jsonl_dir = os.path.join(directory, f"jsonl-{group_rows}")
    os.makedirs(jsonl_dir)
    for start in range(0, len(rows), group_rows):
        with open(os.path.join(jsonl_dir, f"part-{start // group_rows:05d}.jsonl"), "w") as f:
            for row in rows[start : start + group_rows]:
                f.write(json.dumps(row) + "\n")
    return {"parquet": parquet, "jsonl": os.path.join(jsonl_dir, "*.jsonl")}


def shardflow_numpy(path: str) -> int:
    rows = 0
    for batch in sf.DataLoader(sf.dataset(path), batch_size=BATCH):
        rows += len(batch["messages"])
        assert isinstance(batch["messages"][0][0], dict)
    return rows


def shardflow_arrow(path: str) -> int:
    rows = 0
    for batch in sf.DataLoader(sf.dataset(path), batch_size=BATCH, output="arrow"):
        records = batch.to_pylist()
        rows += len(records)
    return rows


def pyarrow_reference(path: str) -> int:
    rows = 0
    if path.endswith(".parquet"):
        batches = pq.ParquetFile(path).iter_batches(batch_size=BATCH)
    else:
        directory = os.path.dirname(path)
        batches = (
            b
            for name in sorted(os.listdir(directory))
            if name.endswith(".jsonl")  # shardflow keeps its line index beside the file
            for b in pj.read_json(os.path.join(directory, name)).to_batches(BATCH)
        )
    for batch in batches:
        rows += len(batch.to_pylist())
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=160_000)
    parser.add_argument("--group-rows", default="5000,20000,80000")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    runners = {"shardflow numpy": shardflow_numpy, "shardflow arrow+to_pylist": shardflow_arrow, "pyarrow to_pylist": pyarrow_reference}
    print(f"{args.rows:,} chat rows, batch {BATCH}, unshuffled, cpus={os.cpu_count()}; median rows/s of {args.repeats}")
    print(f"| rows per group | format | {' | '.join(runners)} |")
    print(f"|---|---|{'---|' * len(runners)}")
    with tempfile.TemporaryDirectory() as directory:
        rows = chat_rows(args.rows)
        all_paths = {int(g): write(directory, rows, int(g)) for g in args.group_rows.split(",")}
        # The generated rows would otherwise sit in every garbage collection of the timed
        # loops (each batch makes thousands of containers), slowing all loaders alike.
        del rows
        gc.collect()
        for group_rows, paths in all_paths.items():
            for fmt, path in paths.items():
                times: dict[str, list[float]] = {name: [] for name in runners}
                for _ in range(args.repeats):
                    for name, run in runners.items():  # interleaved, so drift hits all alike
                        start = time.perf_counter()
                        assert run(path) == args.rows
                        times[name].append(time.perf_counter() - start)
                rates = [f"{args.rows / statistics.median(times[name]) / 1e3:.0f}k" for name in runners]
                print(f"| {group_rows:,} | {fmt} | {' | '.join(rates)} |", flush=True)


if __name__ == "__main__":
    main()
