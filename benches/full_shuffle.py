"""A full-permutation shuffle (``ds.shuffle(seed)``, HF's ``Dataset.shuffle``) over Parquet:
epoch time, time to the first batch and peak RSS, against the same data unshuffled and
buffer-shuffled, and the read plan the loader chose (``stats()["read_plan"]``).

    python benches/full_shuffle.py [--rows 6000 24000] [--row-bytes 262144] [--repeats 3]
        [--compression snappy|zstd|none] [--row-group 64] [--layout pyarrow|hf]
        [--memory-limit 536870912] [--hows full,none,buffer,pyarrow] [--batch 32] [--s3]

Issue 53's setup by default: ROWS rows of ROW_BYTES random bytes (with an id) as 10
Parquet files as ``pyarrow.parquet.write_table`` writes them (snappy, dictionary pages,
no page index) with row groups of 64 rows, one epoch of ``DataLoader(ds, batch_size=32)``
(``--batch``) per fresh process, medians of REPEATS; ``pyarrow`` is the peer that reads
the whole table into memory first, then takes batches from it in a permuted order. Peak RSS is the process's VmHWM. The spill
directory is checked empty after every run (its files never have names). With ``--s3``
the files are read from a SeaweedFS this script starts on 127.0.0.1 (``weed``, as the
tests use), the spill local.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

# How HF `datasets` writes Parquet (`Dataset.to_parquet`, Hub conversions): an offset index,
# and pages cut by content (about 1 MiB) rather than one page per column chunk.
HF_LAYOUT = {"use_dictionary": False, "write_page_index": True, "use_content_defined_chunking": True}

CHILD = """
import glob, json, sys, time
import shardflow as sf
source, how, memory_limit, spill_dir, batch = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
options = json.loads(sys.argv[6]) if len(sys.argv) > 6 else None


def pyarrow_batches():
    # The whole table read into memory, then taken from in the order of a permutation.
    import numpy as np
    import pyarrow.parquet as pq
    filesystem, paths = None, sorted(glob.glob(source))
    if options:
        from pyarrow.fs import FileSelector, S3FileSystem
        filesystem = S3FileSystem(endpoint_override=options["endpoint_url"].split("://", 1)[1], scheme="http",
                                  access_key=options["access_key_id"], secret_key=options["secret_access_key"],
                                  region=options["region"])
        bucket, pattern = source.removeprefix("s3://").split("/", 1)
        paths = sorted(f.path for f in filesystem.get_file_info(FileSelector(bucket)) if f.base_name.startswith(pattern.split("*")[0]))
    table = pq.read_table(paths, filesystem=filesystem)
    order = np.random.default_rng(0).permutation(table.num_rows)
    for at in range(0, len(order), batch):
        yield table.take(order[at : at + batch])


start = time.perf_counter()
if how == "pyarrow":
    loader, batches = None, pyarrow_batches()
else:
    ds = sf.dataset(source, storage_options=options)
    if how == "full":
        ds = ds.shuffle(seed=0)
    elif how == "buffer":
        ds = ds.shuffle(seed=0, buffer_size=1000)
    loader = batches = sf.DataLoader(ds, batch_size=batch, memory_limit=memory_limit, spill_dir=spill_dir)
rows, first = 0, None
for b in batches:
    rows += len(b["id"])
    if first is None:
        first = time.perf_counter() - start
seconds = time.perf_counter() - start
peak = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:")) << 10
print(json.dumps([rows, seconds, first, peak, loader.stats()["read_plan"] if loader else ""]))
"""


def write(directory: Path, rows: int, row_bytes: int, **options: object) -> str:
    """ROWS rows of ROW_BYTES random bytes (with an id) as 10 Parquet files, written by
    ``pq.write_table`` with `options`."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    files = 10
    per_file = rows // files
    for f in range(files):
        ids = np.arange(f * per_file, (f + 1) * per_file)
        data = rng.integers(0, 256, per_file * row_bytes, dtype=np.uint8)
        offsets = np.arange(0, (per_file + 1) * row_bytes, row_bytes, dtype=np.int32)
        blobs = pa.Array.from_buffers(pa.binary(), per_file, [None, pa.py_buffer(offsets), pa.py_buffer(data)])
        pq.write_table(pa.table({"id": ids, "image": blobs}), directory / f"part-{f:02d}.parquet", **options)
    return str(directory / "part-*.parquet")


def epoch(source: str, how: str, memory_limit: int, spill_dir: Path, batch: int,
          storage_options: dict | None = None) -> tuple[int, float, float, int, str]:
    options = [json.dumps(storage_options)] if storage_options else []
    args = [sys.executable, "-c", CHILD, source, how, str(memory_limit), str(spill_dir), str(batch), *options]
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    left = os.listdir(spill_dir) if spill_dir.exists() else []
    assert not left, f"the spill left {left}"
    return tuple(json.loads(out))  # type: ignore[return-value]


@contextlib.contextmanager
def on_s3(directory: Path, pattern: str) -> Iterator[tuple[str, dict]]:
    """The files of `pattern` in a bucket of a SeaweedFS started here: yields their URL
    pattern and the storage options that read them."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from servers import Seaweed

    store = directory / "seaweed"
    store.mkdir()
    server = Seaweed(store, auth=False)
    try:
        client = server.client()
        client.create_bucket(Bucket="bench")
        for path in sorted(Path(pattern).parent.glob(Path(pattern).name)):
            client.upload_file(str(path), "bench", path.name)
        yield f"s3://bench/{Path(pattern).name}", server.storage_options()
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, nargs="+", default=[6000, 24000])
    parser.add_argument("--row-bytes", type=int, default=256 << 10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--layout", choices=["pyarrow", "hf"], default="pyarrow",
                        help="pyarrow's defaults (a dictionary page per column chunk, no page index) "
                        "or HF datasets' (an offset index, pages of about 1 MiB)")
    parser.add_argument("--compression", default="snappy", help="the column chunks' codec (pyarrow's default: snappy)")
    parser.add_argument("--row-group", type=int, default=64, help="rows per row group")
    parser.add_argument("--memory-limit", type=int, default=512 << 20)
    parser.add_argument("--hows", default="full,none,buffer",
                        help="full (ds.shuffle(seed)), none, buffer (buffer_size=1000), "
                        "pyarrow (pq.read_table, then Table.take in the order of a permutation)")
    parser.add_argument("--batch", type=int, default=32, help="rows per batch")
    parser.add_argument("--s3", action="store_true", help="read the files from a local SeaweedFS (S3)")
    args = parser.parse_args()
    hows = args.hows.split(",")
    head = " | ".join(f"{how}: time | first batch | peak RSS" for how in hows)
    print(f"| data | {head} | full / none | full shuffle's plan |")
    print("|---|" + "---|" * (3 * len(hows) + 2))
    for rows in args.rows:
        with tempfile.TemporaryDirectory() as tmp:
            layout = HF_LAYOUT if args.layout == "hf" else {}
            source = write(Path(tmp), rows, args.row_bytes, compression=args.compression,
                           row_group_size=args.row_group, **layout)
            os.sync()  # the files written, not being written back while the loaders run
            spill_dir = Path(tmp) / "spill"
            with contextlib.ExitStack() as stack:
                storage_options = None
                if args.s3:
                    source, storage_options = stack.enter_context(on_s3(Path(tmp), source))
                cells, times, plan = [], {}, ""
                for how in hows:
                    runs = [epoch(source, how, args.memory_limit, spill_dir, args.batch, storage_options)
                            for _ in range(args.repeats)]
                    assert all(r[0] == rows for r in runs), runs
                    times[how] = statistics.median(r[1] for r in runs)
                    cells += [f"{times[how]:.2f} s", f"{statistics.median(r[2] for r in runs):.2f} s",
                              f"{statistics.median(r[3] for r in runs) / 2**20:,.0f} MiB"]
                    plan = runs[0][4] if how == "full" else plan
            ratio = f"{times['full'] / times['none']:.2f}x" if {"full", "none"} <= times.keys() else ""
            size = rows * args.row_bytes / 2**30
            print(f"| {size:.2f} GiB ({rows:,} rows) | " + " | ".join(cells) + f" | {ratio} | {plan} |", flush=True)


if __name__ == "__main__":
    main()
