"""Peak RSS of a plain shuffled DataLoader over large rows.

    python benches/memory_rss.py [--rows 6000] [--row-kb 256] [--repeats 3]

Writes ROWS rows of ROW_KB random bytes (1.5 GB by default) as 10 Parquet files with
100-row row groups, then, in a fresh process each, iterates
``DataLoader(ds.shuffle(seed=0, buffer_size=10_000), batch_size=32)`` with default settings, and with the
byte bounds lifted (the row bound alone, as before they existed), and prints each
process's peak RSS (median over repeats)."""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = """
import sys
import shardflow as sf
source, lifted = sys.argv[1], sys.argv[2] == "1"
ds = sf.dataset(source)
ds = ds.shuffle(seed=0, buffer_size=10_000, buffer_bytes=1 << 62 if lifted else None)
loader = sf.DataLoader(ds, batch_size=32, prefetch_bytes=(1 << 62) if lifted else None)
rows = 0
import warnings
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    for batch in loader:
        rows += len(batch["id"])
# VmHWM, not ru_maxrss: the latter starts from the parent's RSS, which fork passes on.
peak_kb = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:"))
print(rows, peak_kb * 1024, loader.stats()["shuffle_buffer_rows"])
"""


def write(directory: Path, rows: int, row_kb: int, **parquet_options: object) -> str:
    """ROWS rows of ROW_KB random bytes (with an id) as 10 Parquet files, row groups of 100
    rows, uncompressed unless `parquet_options` (which go to `pq.write_table`) say."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    files = 10
    per_file = rows // files
    for f in range(files):
        ids = np.arange(f * per_file, (f + 1) * per_file)
        blobs = [rng.bytes(row_kb * 1024) for _ in ids]
        pq.write_table(pa.table({"id": ids, "image": blobs}), directory / f"part-{f:02d}.parquet",
                       **{"row_group_size": 100, "compression": "none", **parquet_options})
    return str(directory / "part-*.parquet")


def peak(source: str, lifted: bool) -> tuple[int, int, int]:
    out = subprocess.run([sys.executable, "-c", CHILD, source, "1" if lifted else "0"],
                         check=True, capture_output=True, text=True).stdout.split()
    return int(out[0]), int(out[1]), int(out[2])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=6000)
    parser.add_argument("--row-kb", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        source = write(Path(tmp), args.rows, args.row_kb)
        size = sum(p.stat().st_size for p in Path(tmp).glob("*.parquet"))
        print(f"{args.rows} rows x {args.row_kb} KB, {size / 1e9:.2f} GB of Parquet")
        for label, lifted in (("default bounds", False), ("byte bounds lifted", True)):
            runs = [peak(source, lifted) for _ in range(args.repeats)]
            assert all(r[0] == args.rows for r in runs)
            rss = statistics.median(r[1] for r in runs)
            print(f"{label:20s} peak RSS {rss / 2**20:7.0f} MiB   shuffle buffer rows {runs[0][2] or 'row bound'}")


if __name__ == "__main__":
    main()
