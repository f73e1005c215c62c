"""Autotuned defaults against hand-picked settings, per workload, in one run.

    python benches/autotune.py [--repeats 3] [--only parquet,chat,s3]

Workloads (each read in full per run, batch 256, loaders alternating, median of the
repeats; the table gives samples/s and each setting's share of the best):
- ``parquet``: 200k rows of a 784-byte image, a label and a caption (8 files of
  10,000-row row groups), with the loader's streaming shuffle;
- ``chat``: 16 JSONL shards of chat records, half gzipped, ``shuffle(seed, 10_000)``;
- ``s3``: 2,000 objects of 16 KB in SeaweedFS behind the fault proxy adding 25 ms to
  every request (one object = one sample), as from a distant store.

Hand-picked settings: ``num_threads`` in (1, 2, cores) times ``prefetch`` in (2, 8, 32);
for S3, ``num_threads=cores`` (which fixes 128 units read ahead) with the storage
option ``max_concurrency`` in (16, 64, 128). The defaults are ``num_threads=None,
prefetch=None`` and the storage defaults.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from faultproxy import FaultProxy  # noqa: E402
from peer_chat import write_shards  # noqa: E402
from rss_epochs import write as write_parquet  # noqa: E402
from servers import Seaweed  # noqa: E402

import shardflow as sf  # noqa: E402

BATCH = 256
CORES = len(os.sched_getaffinity(0))
S3_OBJECTS, S3_OBJECT_BYTES = 2000, 16 * 1024

Settings = dict[str, object]


def local_grid() -> dict[str, Settings]:
    grid: dict[str, Settings] = {"defaults (autotune)": {}}
    for threads in sorted({1, 2, CORES}):
        for prefetch in (2, 8, 32):
            grid[f"num_threads={threads}, prefetch={prefetch}"] = {"num_threads": threads, "prefetch": prefetch}
    return grid


def count(ds: sf.Dataset, settings: Settings, shuffle: bool) -> int:
    loader = sf.DataLoader(ds, batch_size=BATCH, shuffle=shuffle, output="arrow", **settings)
    return sum(batch.num_rows for batch in loader)


def measure(run: Callable[[], int], repeats: list[float]) -> None:
    start = time.perf_counter()
    rows = run()
    repeats.append(rows / (time.perf_counter() - start))


def report(name: str, results: dict[str, list[float]]) -> None:
    medians = {setting: statistics.median(r) for setting, r in results.items()}
    best = max(v for k, v in medians.items() if not k.startswith("defaults"))
    print(f"\n{name}")
    print("| setting | samples/s | of the best hand-picked |")
    print("|---|---|---|")
    for setting, value in medians.items():
        print(f"| {setting} | {value:,.0f} | {value / best:.0%} |")


def run_grid(name: str, runs: dict[str, Callable[[], int]], repeats: int) -> None:
    results: dict[str, list[float]] = {setting: [] for setting in runs}
    next(iter(runs.values()))()  # warm-up (page cache, allocator), not measured
    for _ in range(repeats):
        for setting, run in runs.items():  # alternating, so drift hits all alike
            measure(run, results[setting])
    report(name, results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", default="parquet,chat,s3")
    args = parser.parse_args()
    only = set(args.only.split(","))
    print(f"cores={CORES}, medians of {args.repeats}")
    with tempfile.TemporaryDirectory() as d:
        if "parquet" in only:
            ds = sf.dataset(write_parquet(Path(d), 200_000))
            runs = {k: (lambda s=s: count(ds, s, shuffle=True)) for k, s in local_grid().items()}
            run_grid("Parquet, 200k rows of 784-byte images, DataLoader(shuffle=True)", runs, args.repeats)
        if "chat" in only:
            ds = sf.dataset(write_shards(d, 16, 10_000)).shuffle(7, buffer_size=10_000)
            runs = {k: (lambda s=s: count(ds, s, shuffle=False)) for k, s in local_grid().items()}
            run_grid("chat JSONL, 160k rows, half gzip, shuffle(seed, 10_000)", runs, args.repeats)
        if "s3" in only:
            measure_s3(Path(d), args.repeats)


def measure_s3(directory: Path, repeats: int) -> None:
    (directory / "seaweed").mkdir()
    server = Seaweed(directory / "seaweed", auth=False)
    proxy = FaultProxy("127.0.0.1", server.ports["s3"])
    try:
        client = server.client()
        client.create_bucket(Bucket="bench")
        payload = os.urandom(S3_OBJECT_BYTES)
        with ThreadPoolExecutor(32) as pool:
            list(pool.map(lambda i: client.put_object(Bucket="bench", Key=f"o/{i:05d}", Body=payload), range(S3_OBJECTS)))
        proxy.set_faults(latency=0.025)

        def run(settings: Settings, storage: dict) -> Callable[[], int]:
            options = server.storage_options(proxy.url, **storage)
            ds = sf.dataset("s3://bench/o/", format="raw", storage_options=options)
            return lambda: count(ds, settings, shuffle=True)

        runs = {"defaults (autotune)": run({}, {})}
        for concurrency in (16, 64, 128):
            runs[f"num_threads={CORES}, max_concurrency={concurrency}"] = run({"num_threads": CORES}, {"max_concurrency": concurrency})
        run_grid(f"S3, {S3_OBJECTS:,} objects of 16 KB, +25 ms per request", runs, repeats)
    finally:
        proxy.close()
        server.stop()


if __name__ == "__main__":
    main()
